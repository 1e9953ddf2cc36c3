"""The build dir's Vela cache (ethosu/vela_cache.py), with real Vela compiles: a hit writes what a compile
writes, byte for byte; a damaged entry is compiled again and replaced, never used; the key follows the graph, the
.ini and the options, not where the files are; and on a real build the vela stage restores what the lower
stage's measured choices or the precision search compiled (Vela's forks counted by bench/runclock, outside
npubuild)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO
from npbtest.builds import sensitive_conv_model, write_spec
from npbtest.ops import calib, quantize_model, single_op_model

from npubuild.config.load import default_search_path, load_target
from npubuild.config.schema import TargetProfile
from npubuild.ethosu.vela import compile_partition, stage_command
from npubuild.ethosu.vela_cache import Action, VelaCache, for_stage_dir
from npubuild.ethosu.vela_ini import render_ini
from npubuild.lowering.driver import lower_model
from npubuild.store import MANIFEST

RECORDS = ("stage.json", "inputs.json")  # a stage dir's records: run ids, keys, seconds


@pytest.fixture(scope="module")
def conv_tosa() -> bytes:
    w = np.random.default_rng(5).uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32)
    model = quantize_model(single_op_model("Conv", {"x": [1, 4, 8, 8]}, {"y": None}, {"w": w}, pads=[1, 1, 1, 1]),
                           calib("x", [1, 4, 8, 8]))
    return lower_model(model, "int").tosa


def _profile(name: str = "ethos-u55-128") -> TargetProfile:
    return load_target(name, default_search_path(REPO), None)[0]


def _stage_dir(build: Path, name: str, profile: TargetProfile) -> tuple[Path, Path]:
    """A vela stage dir in a build dir's layout, with its .ini: (dir, ini)."""
    d = build / "stages" / "vela" / name
    d.mkdir(parents=True)
    ini = d / "system.ini"
    ini.write_text(render_ini(profile))
    return d, ini


def _compile(tosa: Path, build: Path, name: str, cache: VelaCache | None, profile: TargetProfile | None = None) -> dict:
    profile = profile or _profile()
    d, ini = _stage_dir(build, name, profile)
    res = compile_partition(tosa, "model", ini, d, profile, profile.vela, cache)
    return {"summary": res["summary"], "ops": (res["npu_ops"], res["cpu_ops"]), "artifacts": res["artifacts"],
            "moved": res["moved"], "sizes": res["artifact"].sizes(), "files": _files(d)}


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name not in RECORDS}


def _setup(tmp_path: Path, tosa: bytes) -> tuple[Path, Path, VelaCache]:
    """The graph as model.tosa, a build dir, and that build dir's (empty) Vela cache."""
    src = tmp_path / "model.tosa"
    src.write_bytes(tosa)
    build = tmp_path / "build"
    return src, build, VelaCache(build / ".cache" / "vela")


def _entry(cache: VelaCache) -> Path:
    (entry,) = [m.parent for m in cache.root.glob(f"??/*/{MANIFEST}")]
    return entry


def _stored(entry: Path, rel: str) -> Path:
    """Where the entry's manifest says file `rel` is stored."""
    return entry / json.loads((entry / MANIFEST).read_text())["files"][rel]["path"]


def test_a_hit_gives_the_vela_stage_the_bytes_a_compile_gives(tmp_path: Path, conv_tosa: bytes):
    src, build, cache = _setup(tmp_path, conv_tosa)
    plain = _compile(src, build, "plain-00000000", None)
    missed = _compile(src, build, "miss-00000001", cache)
    assert (cache.hits, cache.misses) == (0, 1)
    hit = _compile(src, build, "hit-00000002", cache)
    assert (cache.hits, cache.misses) == (1, 1)
    assert plain == missed == hit
    assert {"vela.log", "model_per-layer.csv", "model_vela.tflite"} <= set(hit["files"])
    assert "NPU operators" in hit["files"]["vela.log"].decode() and hit["moved"]  # the report and the debug db
    assert b".vela-" not in hit["files"]["vela.log"]  # the stage's temp dir written as its own, hit or not


def test_a_damaged_entry_is_compiled_again_and_replaced_never_used(tmp_path: Path, conv_tosa: bytes):
    src, build, cache = _setup(tmp_path, conv_tosa)
    first = _compile(src, build, "a-00000000", cache)
    entry = _entry(cache)
    tflite = _stored(entry, "out/model_vela.tflite")
    whole = tflite.read_bytes()

    tflite.write_bytes(whole[: len(whole) // 2])  # truncated: the manifest's size and sha256 no longer match
    assert _compile(src, build, "b-00000001", cache) == first
    assert (cache.hits, cache.misses) == (0, 2)
    assert _stored(entry, "out/model_vela.tflite").read_bytes() == whole  # replaced by the new compile's

    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["out/model_vela.tflite"]["sha256"] = "0" * 64  # a manifest that does not match its files
    (entry / MANIFEST).write_text(json.dumps(manifest))
    assert _compile(src, build, "c-00000002", cache) == first
    assert (cache.hits, cache.misses) == (0, 3)
    assert json.loads((entry / MANIFEST).read_text())["files"]["out/model_vela.tflite"]["sha256"] != "0" * 64

    (entry / MANIFEST).write_text((entry / MANIFEST).read_text()[:40])  # a partial manifest
    assert _compile(src, build, "d-00000003", cache) == first
    assert (cache.hits, cache.misses) == (0, 4)
    assert _compile(src, build, "e-00000004", cache) == first  # the replaced entry verifies: used
    assert (cache.hits, cache.misses) == (1, 4)


def test_an_entry_without_output_files_is_a_miss_and_none_is_kept(tmp_path: Path, conv_tosa: bytes):
    """A compile that wrote no output file is nothing to replay: such an entry (a Vela child that lost its
    outputs to a full disk once exited 0, and its entry then failed every later build of the graph with an
    internal error) is a miss and is replaced, and such a compile is not kept."""
    src, build, cache = _setup(tmp_path, conv_tosa)
    first = _compile(src, build, "a-00000000", cache)
    work = tmp_path / "w"
    work.mkdir()
    shutil.copyfile(src, work / "model.tosa")
    profile = _profile()
    cmd = stage_command(work / "model.tosa", build / "stages" / "vela" / "a-00000000" / "system.ini", work / "out",
                        profile, profile.vela)
    action = Action.of(cmd)
    assert action is not None and action.key == _entry(cache).name  # the key of the compile above
    cache.store.put_files(action.key, {"stdout": b"", "stderr": b""}, {})  # the empty entry, as it was written
    cache.put(action, subprocess.CompletedProcess(cmd, 0, "", ""))  # such a compile (no out dir at all)
    assert cache.store.read(action.key, {"stdout", "stderr"}, cache.max_bytes) == {"stdout": b"", "stderr": b""}
    assert cache.get(action) is None and (cache.hits, cache.misses) == (0, 2)  # not replayed
    assert _compile(src, build, "b-00000001", cache) == first  # compiled again, and kept
    assert cache.get(action) is not None and (cache.hits, cache.misses) == (1, 3)


def test_an_entry_of_the_layout_before_the_store_is_replaced_not_left(tmp_path: Path, conv_tosa: bytes):
    """The entries before npubuild/store.py (files under f/, a manifest without a writer) have the same keys: the
    first lookup of one discards it, and the compile's entry takes its place."""
    src, build, cache = _setup(tmp_path, conv_tosa)
    first = _compile(src, build, "a-00000000", cache)
    entry = _entry(cache)
    files = {rel: _stored(entry, rel).read_bytes() for rel in json.loads((entry / MANIFEST).read_text())["files"]}
    shutil.rmtree(entry)
    for rel, data in files.items():
        (entry / "f" / rel).parent.mkdir(parents=True, exist_ok=True)
        (entry / "f" / rel).write_bytes(data)
    old = {"key": entry.name, "files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                                        for rel, d in files.items()}}
    (entry / MANIFEST).write_text(json.dumps(old, sort_keys=True, indent=1))
    assert _compile(src, build, "b-00000001", cache) == first
    assert (cache.hits, cache.misses) == (0, 2) and not (entry / "f").exists()
    assert _compile(src, build, "c-00000002", cache) == first and cache.hits == 1


def _key(tmp: Path, tosa: bytes, profile: TargetProfile, ini_text: str | None = None, name: str = "model",
         opts=None) -> str:
    work = tmp / "work"
    work.mkdir(parents=True)
    (work / f"{name}.tosa").write_bytes(tosa)
    ini = tmp / "system.ini"
    ini.write_text(ini_text or render_ini(profile))
    action = Action.of(stage_command(work / f"{name}.tosa", ini, work / "out", profile, opts or profile.vela))
    assert action is not None
    return action.key


def test_the_key_follows_the_graph_ini_and_options_not_the_paths(tmp_path: Path, conv_tosa: bytes):
    u55 = _profile()
    base = _key(tmp_path / "a", conv_tosa, u55)
    assert _key(tmp_path / "elsewhere" / "b", conv_tosa, u55) == base  # the same compile anywhere
    other_tosa = bytearray(conv_tosa)
    other_tosa[-1] ^= 1
    ini = render_ini(u55)
    others = [_key(tmp_path / "c", bytes(other_tosa), u55),
              _key(tmp_path / "d", conv_tosa, u55, ini.replace("core_clock=500000000", "core_clock=250000000")),
              _key(tmp_path / "e", conv_tosa, u55, opts=u55.vela.model_copy(update={"optimise": "Size"})),
              _key(tmp_path / "f", conv_tosa, u55, opts=u55.vela.model_copy(update={"cascading": False})),
              _key(tmp_path / "g", conv_tosa, u55, opts=u55.vela.model_copy(update={"extra_flags": ["--disable-fwd"]})),
              _key(tmp_path / "h", conv_tosa, u55, name="u55_model"),  # Vela names its outputs after the file
              _key(tmp_path / "i", conv_tosa, _profile("ethos-u55-64"))]
    assert len({base, *others}) == 1 + len(others)


def test_only_a_stage_dir_of_a_build_dir_has_a_cache(tmp_path: Path):
    cache = for_stage_dir(tmp_path / "b" / "stages" / "vela" / "x-00000000")
    assert cache is not None and cache.root == tmp_path / "b" / ".cache" / "vela"
    assert for_stage_dir(tmp_path / "npubuild-task-1" / "out") is None  # a Dask worker's temp dir


def test_past_its_bound_the_least_recently_used_entries_go(tmp_path: Path, conv_tosa: bytes):
    src, build, cache = _setup(tmp_path, conv_tosa)
    _compile(src, build, "a-00000000", cache)
    first = _entry(cache)
    size = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    os.utime(first / MANIFEST, (1, 1))  # long unused
    cache.max_bytes = size + size // 2  # room for one entry, not two
    _compile(src, build, "b-00000001", cache, _profile("ethos-u55-64"))
    assert not first.exists() and len(list(cache.root.glob(f"??/*/{MANIFEST}"))) == 1


def _vela_compiles(project: Path, spec: str | None = None) -> dict[str, int]:
    """A real build of `project` on ethos-u55-128 (its shared cache off); the Vela compiles each stage ran, counted
    by bench/runclock in the fork that ran each."""
    clock = project / "runclock.log"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench' / 'runclock'}",
           "NPUBUILD_RUNCLOCK": str(clock)}
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", *([spec] if spec else []), "--build-dir",
                           str(project / "build"), "--cache", "off", "--only", "ethos-u55-128", "-q"], cwd=project,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts: dict[str, int] = {}
    for line in clock.read_text().splitlines():
        kind, stage, _ = line.split()
        if kind == "vela":  # one line per Vela compile, in the fork that ran it
            counts[stage] = counts.get(stage, 0) + 1
    clock.unlink()
    return counts


def test_the_vela_stage_restores_the_graph_the_measured_choices_compiled(project: Path):
    """A real build (DS-CNN on ethos-u55-128, the shipped profile its family is measured on, where its narrow
    plane means are measured): the lower stage's measured choices compile with the vela stage's command line, so
    the vela stage compiles nothing; built again with the cache removed, the vela stage compiles, and writes the
    very same files."""
    build = project / "build"
    first = _vela_compiles(project)
    assert first.get("lower", 0) >= 2 and "vela" not in first, first
    (vela_dir,) = (build / "stages" / "vela").iterdir()
    hit = _files(vela_dir)
    shutil.rmtree(build / ".cache" / "vela")
    shutil.rmtree(vela_dir)
    assert _vela_compiles(project) == {"vela": 1}  # the lower stage's output is kept; the vela stage compiles its graph
    assert _files(vela_dir) == hit


def test_the_vela_stage_restores_what_the_precision_search_compiled(project: Path):
    """`precision: auto` compiles its candidates in the precision stage's dir, so with the build dir's cache: the
    vela stage of the candidate kept restores the search's compile of it, and writes what a compile writes."""
    onnx.save(sensitive_conv_model(), project / "configs" / "models" / "sensitive.onnx")
    spec = write_spec(project, "sens", "sensitive.onnx", [1, 3, 8, 8], "[ethos-u55-128]",
                      extra="quantization: {precision: auto, budget: {min_snr_db: 30, weights_int4: false}}\n")
    build = project / "build"
    first = _vela_compiles(project, str(spec))
    assert first.get("precision", 0) >= 2 and "vela" not in first, first
    (vela_dir,) = (build / "stages" / "vela").iterdir()
    hit = _files(vela_dir)
    shutil.rmtree(build / ".cache" / "vela")
    shutil.rmtree(vela_dir)
    assert _vela_compiles(project, str(spec)) == {"vela": 1}
    assert _files(vela_dir) == hit
