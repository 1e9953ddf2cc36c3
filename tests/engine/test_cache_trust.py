"""The shared cache: killed writers' debris is removed by verify and prune, and with a team key only entries
whose manifest MAC holds are restored (write access to the storage alone cannot plant an entry)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from npbtest import read_run

from npubuild.engine.cache import StageCache

KEY = "team-secret-0123456789"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_CACHE")}
    return {**env, **extra}


def _build(project: Path, build_dir: Path, cache: Path, **env: str) -> subprocess.CompletedProcess:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    return subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(build_dir), "-q",
                           "--cache", str(cache)], cwd=project, env=_env(**env), capture_output=True, text=True,
                          timeout=600)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npubuild", *args], env=_env(**env), capture_output=True, text=True,
                          timeout=300)


def _killed_writer(cache: Path, src: Path, key: str, at: str) -> None:
    """A real writer SIGKILLed inside `put`: before its manifest lands (`at='manifest'`) or after its first
    file (`at='files'`)."""
    code = f"""
import os, signal
from pathlib import Path
from npubuild.engine.cache import StageCache
c = StageCache({str(cache)!r})
if {at!r} == "manifest":
    c.fs.mv = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
else:
    real_open, calls = c.fs.open, []
    def open_then_die(path, mode="rb", **kw):
        calls.append(path)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_open(path, mode, **kw)
    c.fs.open = open_then_die
c.put({key!r}, Path({str(src)!r}), {{}}, set())
"""
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (old, old))


def test_debris_of_killed_writers_is_removed_by_verify_and_prune(project: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    assert _build(project, project / "b1", cache).returncode == 0
    src = next((project / "b1" / "stages" / "vela").iterdir())
    before = _du(cache)
    _killed_writer(cache, src, "ab" * 20, "manifest")  # a new key: writer dir + temp manifest, no manifest
    existing = next(p.name for p in cache.glob("*/*") if p.is_dir())
    _killed_writer(cache, src, existing, "files")  # beside a complete entry: a half-written writer dir
    assert _du(cache) > before
    young = _cli("cache", "verify", "--cache", str(cache))
    assert young.returncode == 0 and _du(cache) > before  # a writer this young may still be at work: kept
    for d in cache.glob("*/*"):  # two hours later: everything but each entry's manifest and its writer dir
        manifest = d / "manifest.json"
        live = json.loads(manifest.read_text())["writer"] if manifest.exists() else None
        for child in d.iterdir():
            if child.name not in ("manifest.json", live):
                _age(child, 7200)
    stats = _cli("cache", "stats", "--cache", str(cache))
    assert "left by killed writers" in stats.stdout, stats.stdout
    for size, unit in re.findall(r"(\d+(?:\.\d)?) (B|KiB|MiB|GiB)\b", stats.stdout):  # human units: `2.2 MiB`,
        assert float(size) < 1024 or unit == "GiB"  # never `68813.5 KiB`
    proc = _cli("cache", "verify", "--cache", str(cache))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _du(cache) == before
    assert StageCache(str(cache)).stats()["bytes"] == before - sum(
        p.stat().st_size for p in cache.glob("*/*/manifest.json"))

    _killed_writer(cache, src, "cd" * 20, "manifest")
    _age(cache / "cd", 7200)
    proc = _cli("cache", "prune", "--older-than", "30d", "--cache", str(cache))
    assert proc.returncode == 0 and _du(cache) == before and not (cache / "cd" / ("cd" * 20)).exists()


def _forge(cache: Path, stage_key: str, name: str, data: bytes) -> None:
    """What anyone with write access to the storage can do: replace a file and its manifest entry together."""
    entry = cache / stage_key[:2] / stage_key
    manifest = json.loads((entry / "manifest.json").read_text())
    info = manifest["files"][name]
    (entry / info["path"]).write_bytes(data)
    info.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (entry / "manifest.json").write_text(json.dumps(manifest))


def test_with_a_team_key_a_forged_entry_is_not_restored(project: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    key_file = tmp_path / "cache.key"
    key_file.write_text(KEY + "\n")
    first = _build(project, project / "b1", cache, NPUBUILD_CACHE_KEY_FILE=str(key_file))
    assert first.returncode == 0, first.stderr
    records = {json.loads(p.read_text())["stage"]: json.loads(p.read_text())
               for p in (project / "b1" / "stages").glob("*/*/stage.json")}
    good = (project / "b1" / "stages" / "vela").glob("*/summary.json").__next__().read_bytes()
    summary = json.loads(good)
    forged = json.dumps({**summary, "forged": True}).encode()
    _forge(cache, records["vela"]["cache_key"], "summary.json", forged)
    assert KEY not in "".join(p.read_text(errors="replace") for p in cache.rglob("*") if p.is_file())

    second = _build(project, project / "b2", cache, NPUBUILD_CACHE_KEY=KEY)
    assert second.returncode == 0, second.stderr
    (warning,) = [ln for ln in second.stderr.splitlines() if ln.startswith("warning:")]
    assert records["vela"]["cache_key"] in warning and "not restored" in warning
    run = read_run(project / "b2")
    assert [n for n in run["executed"] if n not in run["from_cache"]] == [
        n for n in run["executed"] if n.startswith(("vela:", "report:"))]  # only the forged one recomputed
    assert next((project / "b2" / "stages" / "vela").glob("*/summary.json")).read_bytes() == good

    _forge(cache, records["lower"]["cache_key"], "io.json", b"{}")
    proc = _cli("cache", "verify", "--cache", str(cache), NPUBUILD_CACHE_KEY=KEY)
    assert proc.returncode == 1 and records["lower"]["cache_key"] in proc.stdout


def _planted_entry(cache_dir: Path, tmp_path: Path, tamper: str) -> tuple[StageCache, str, Path]:
    """A real entry put by StageCache, then its manifest rewritten as a writer to the storage could (no key)."""
    src = tmp_path / "src"
    (src / "raw").mkdir(parents=True)
    (src / "model.tosa").write_bytes(b"tosa" * 100)
    (src / "raw" / "model_vela.npz").write_bytes(b"npz" * 50)
    cache, key = StageCache(str(cache_dir), use_env_key=False), "ef" * 20
    cache.put(key, src, {"ops": 3}, set())
    entry = cache_dir / key[:2] / key
    manifest = json.loads((entry / "manifest.json").read_text())
    writer, evil = manifest["writer"], b"planted\n"
    (entry / writer / "evil").write_bytes(evil)
    planted = {"path": f"{writer}/evil", "sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)}
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"the builder's own file")
    stolen = {"sha256": hashlib.sha256(secret.read_bytes()).hexdigest(), "size": secret.stat().st_size}
    if tamper == "dotdot-name":
        manifest["files"]["../../outside.txt"] = planted
    elif tamper == "absolute-name":
        manifest["files"][str(tmp_path / "outside.txt")] = planted
    elif tamper == "reserved-name":
        manifest["files"]["stage.json"] = planted
    elif tamper == "path-out-of-the-entry":
        manifest["files"]["stolen.txt"] = {**stolen, "path": os.path.relpath(secret, entry)}
    elif tamper == "symlink-out-of-the-entry":
        os.symlink(secret, entry / writer / "stolen.txt")
        manifest["files"]["stolen.txt"] = {**stolen, "path": f"{writer}/stolen.txt"}
    elif tamper == "not-a-mapping":
        manifest["files"]["model.tosa"] = 5
    elif tamper == "size-not-a-number":
        manifest["files"]["model.tosa"]["size"] = "400"
    (entry / "manifest.json").write_text(json.dumps(manifest))
    return cache, key, entry


@pytest.mark.parametrize("tamper", ["dotdot-name", "absolute-name", "reserved-name", "path-out-of-the-entry",
                                    "symlink-out-of-the-entry", "not-a-mapping", "size-not-a-number"])
def test_a_manifest_naming_files_outside_its_entry_is_discarded_and_nothing_is_written(tmp_path: Path,
                                                                                    tamper: str):
    """Without a team key the cache trusts its writers' content, but never their paths: a manifest is data,
    and an entry only restores `<writer>/<name>` files into the stage dir it is restored into."""
    cache, key, entry = _planted_entry(tmp_path / "cache", tmp_path, tamper)
    dest = tmp_path / "build" / "stages" / "lower" / "m-1234"
    dest.mkdir(parents=True)
    assert cache.get(key, dest, {"model.tosa"}) is None
    assert not entry.exists()  # discarded: the next put replaces it
    assert list(dest.iterdir()) == [] and not (tmp_path / "outside.txt").exists()
    assert not list((tmp_path / "build").rglob("outside.txt"))


def test_verify_discards_a_manifest_naming_files_outside_its_entry(tmp_path: Path):
    cache, key, entry = _planted_entry(tmp_path / "cache", tmp_path, "path-out-of-the-entry")
    assert cache.verify() == (1, [key]) and not entry.exists()


def test_a_malformed_entry_is_recomputed_by_the_build_not_an_internal_error(project: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    assert _build(project, project / "b1", cache).returncode == 0
    records = {json.loads(p.read_text())["stage"]: json.loads(p.read_text())
               for p in (project / "b1" / "stages").glob("*/*/stage.json")}
    key = records["quantize"]["cache_key"]
    manifest_path = cache / key[:2] / key / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["model_qdq.onnx"] = 5
    manifest_path.write_text(json.dumps(manifest))
    second = _build(project, project / "b2", cache)
    assert second.returncode == 0, second.stderr
    (warning,) = [ln for ln in second.stderr.splitlines() if ln.startswith("warning:")]
    assert key in warning and "malformed" in warning and "Traceback" not in second.stderr
    run = read_run(project / "b2")
    assert "quantize:" in " ".join(n for n in run["executed"] if n not in run["from_cache"])
    assert json.loads(manifest_path.read_text())["files"]["model_qdq.onnx"]["size"] > 0  # replaced by the rerun
