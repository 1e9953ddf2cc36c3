"""A downstream stage's cache key and up-to-date check cover the content of every file its upstream stages
wrote (the .tosa graphs io.json names, not only io.json); a cache reached over a URL needs a team key or the
explicit opt-out; entries are streamed, verified per file and bounded in size (issue 34: a tampered model.tosa
was restored beside the clean tosa-check and Vela entries, and the report's SNR belonged to another graph)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import read_report, read_run
from npbtest.builds import conv_chain_model, write_spec
from onnx import numpy_helper

from npubuild.engine.cache import StageCache
from npubuild.store import MAX_FILE_BYTES


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_CACHE")}, **extra}


def _project(root: Path, flip_seed: int | None = None) -> Path:
    """The project; `flip_seed`: the first conv's weights with random signs, another function of the input."""
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    model = conv_chain_model(8, 8)
    if flip_seed is not None:
        w = model.graph.initializer[0]
        a = numpy_helper.to_array(w)
        signs = np.random.default_rng(flip_seed).choice([-1.0, 1.0], a.shape)
        w.CopyFrom(numpy_helper.from_array((a * signs).astype(np.float32), w.name))
    onnx.save(model, root / "configs" / "models" / "m.onnx")
    write_spec(root, "m", "m.onnx", [1, 4, 8, 8], "[ethos-u55-128]")
    return root


def _build(root: Path, build_dir: Path, cache: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--build-dir", str(build_dir),
                           "--cache", cache], cwd=root, env=_env(**env), capture_output=True, text=True, timeout=600)


def _plant(cache: Path, name: str, data: bytes) -> Path:
    """Replace `name` in the cache entry holding it, with its manifest's sha256 and size to match: what anyone
    who can write to an unkeyed cache can do."""
    (manifest_path,) = [m for m in cache.glob("*/*/manifest.json") if name in json.loads(m.read_text())["files"]]
    manifest = json.loads(manifest_path.read_text())
    info = manifest["files"][name]
    (manifest_path.parent / info["path"]).write_bytes(data)
    info.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    manifest_path.write_text(json.dumps(manifest))
    return manifest_path


def _names(run: dict, key: str, stage: str) -> list[str]:
    return [t for t in run[key] if t.startswith(f"{stage}:")]


def test_a_planted_upstream_graph_reruns_the_checks_that_read_it(tmp_path: Path):
    root = _project(tmp_path / "p")
    cache = tmp_path / "cache"
    assert _build(root, root / "b1", str(cache)).returncode == 0
    clean = read_report(root / "b1")["builds"][0]
    other = _project(tmp_path / "other", flip_seed=0)  # the same shapes, other weights: another graph
    assert _build(other, other / "b", "off").returncode == 0
    (planted,) = (other / "b" / "stages" / "lower").glob("*/model.tosa")
    _plant(cache, "model.tosa", planted.read_bytes())

    # a fresh build dir: the lower stage is restored with the planted graph; the TOSA check and Vela read it,
    # so their keys differ from the clean entries' and they run on what is there
    proc = _build(root, root / "b2", str(cache))
    run = read_run(root / "b2")
    assert _names(run, "from_cache", "lower"), run
    for stage in ("tosa-check", "vela"):
        assert _names(run, "executed", stage) and not _names(run, "from_cache", stage), (stage, run)
    entry = read_report(root / "b2")["builds"][0]
    assert entry["metrics"]["tosa_snr_db"] != clean["metrics"]["tosa_snr_db"] or proc.returncode != 0

    # a build dir whose TOSA check is up to date: its lower stage restored with the planted graph (its record
    # dropped, as a corrupted output makes it) must not leave the check's record standing for the old graph
    next((root / "b1" / "stages" / "lower").glob("*/stage.json")).unlink()
    _build(root, root / "b1", str(cache))
    run = read_run(root / "b1")
    assert _names(run, "from_cache", "lower") and _names(run, "executed", "tosa-check"), run
    assert not _names(run, "cached", "tosa-check") and not _names(run, "cached", "vela"), run


def test_the_keys_of_a_stage_reading_only_user_files_do_not_move(tmp_path: Path):
    """Only the stages downstream of another stage's outputs take the new key: the import's entries stay."""
    root = _project(tmp_path / "p")
    assert _build(root, root / "b", str(tmp_path / "cache")).returncode == 0
    (imp,) = (root / "b" / "stages" / "import").glob("*/inputs.json")
    (tosa,) = (root / "b" / "stages" / "tosa-check").glob("*/inputs.json")
    assert json.loads(imp.read_text())["upstream"] == {}
    assert set(json.loads(tosa.read_text())["upstream"]) == {"io", "reference", "float"}


@pytest.mark.parametrize("env", [{}, {"NPUBUILD_CACHE_KEY": "team-secret"}, {"NPUBUILD_CACHE_UNKEYED": "1"}],
                         ids=["no-key", "key", "opt-out"])
def test_a_cache_reached_over_a_url_needs_a_key_or_the_opt_out(tmp_path: Path, env: dict[str, str]):
    root = _project(tmp_path / "p")
    url = f"file://{tmp_path / 'shared'}"
    proc = _build(root, root / "b", url, **env)
    if env:
        assert proc.returncode == 0, proc.stderr
        assert any((tmp_path / "shared").glob("*/*/manifest.json"))
        return
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: the stage cache {url} is reached over a URL, so shared, and has no "
                                  "team key: set $NPUBUILD_CACHE_KEY")
    assert not (root / "b" / "stages").exists() and not (tmp_path / "shared").exists()
    # a directory (the project's own cache, the default) may stay unkeyed
    assert _build(root, root / "b", str(tmp_path / "local")).returncode == 0


def test_an_unknown_cache_protocol_is_one_line_exit_2(tmp_path: Path):
    root = _project(tmp_path / "p")
    proc = _build(root, root / "b", "nosuchproto://x")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "names protocol 'nosuchproto', which fsspec does not know" in proc.stderr


def _restore_under_limit(cache: Path, key: str, dest: Path, limit_mib: int) -> subprocess.CompletedProcess:
    code = f"""
import resource, sys
from pathlib import Path
from npubuild.engine.cache import StageCache
c = StageCache({str(cache)!r}, use_env_key=False)
with open('/proc/self/statm') as f:
    now = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (now + ({limit_mib} << 20), resource.RLIM_INFINITY))
entry = c.get({key!r}, Path({str(dest)!r}), {{"big.bin"}})
print("restored" if entry is not None else "missed")
"""
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)


def test_an_entry_is_streamed_never_read_whole(tmp_path: Path):
    """A 192 MiB entry file restores within 48 MiB more address space than the restoring process had (it was
    read whole: a planted 5 GiB file cost 5.3 GB of RSS)."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        for i in range(192):
            f.write(bytes([i]) * (1 << 20))
    cache = StageCache(tmp_path / "cache", use_env_key=False)
    key = "cd" * 20
    cache.put(key, src, {}, set())
    proc = _restore_under_limit(tmp_path / "cache", key, tmp_path / "dest", 48)
    assert proc.stdout.strip() == "restored", proc.stderr[-2000:]
    assert (tmp_path / "dest" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_an_entry_larger_than_a_stage_output_may_be_is_discarded_unread(tmp_path: Path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(b"x")
    cache = StageCache(tmp_path / "cache", use_env_key=False)
    key = "ef" * 20
    cache.put(key, src, {}, set())
    _plant(tmp_path / "cache", "big.bin", b"x")
    (manifest,) = (tmp_path / "cache").glob("*/*/manifest.json")
    data = json.loads(manifest.read_text())
    data["files"]["big.bin"]["size"] = MAX_FILE_BYTES + 1  # a planted 4 GiB + 1 claim
    manifest.write_text(json.dumps(data))
    dest = tmp_path / "dest"
    assert cache.get(key, dest, {"big.bin"}) is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: cache entry {key}: big.bin is 4.0 GiB, over the 4 GiB") and err.count("\n") == 1
    assert not manifest.exists() and not dest.exists()


def test_restored_files_have_the_usual_mode(tmp_path: Path):
    src = tmp_path / "src"
    (src / "raw").mkdir(parents=True)
    (src / "raw" / "a.bin").write_bytes(b"abc")
    cache = StageCache(tmp_path / "cache", use_env_key=False)
    cache.put("ab" * 20, src, {}, set())
    dest = tmp_path / "dest"
    assert cache.get("ab" * 20, dest, {"raw/a.bin"}) is not None
    umask = os.umask(0)
    os.umask(umask)
    assert (dest / "raw" / "a.bin").stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in dest.iterdir()] == ["raw"]  # no temp file left




def test_the_same_graph_built_twice_gives_its_consumers_the_same_keys(tmp_path: Path):
    """Content keys only pay if a stage rerun on the same input writes the same bytes: Vela's log named its
    outputs by their temp dir, so every rerun of Vela moved the keys of the stages after it (cache misses)."""
    root = _project(tmp_path / "p")
    for build_dir in ("b1", "b2"):
        assert _build(root, root / build_dir, "off").returncode == 0

    def upstream(build_dir: str) -> dict[str, dict]:
        return {p.parent.parent.name + "/" + p.parent.name: json.loads(p.read_text())["upstream"]
                for p in (root / build_dir / "stages").glob("*/*/inputs.json")}

    first = upstream("b1")
    assert any(first.values()) and first == upstream("b2")
