"""A finished stage output that is truncated or edited afterwards is never reused: its task reruns and says so.

One build of the kws example (one target) is copied for each case, so every case starts from a complete
build dir whose files all have new ctimes (the copy): the first rebuild re-hashes them once and keeps them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from npbtest import REPO, read_report, read_run, run_cli

from npubuild.engine.uptodate import INPUTS_NAME, stat_signature


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("integrity") / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    spec = (REPO / "configs" / "kws.yaml").read_text()
    spec = spec.replace("targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]", "targets: [ethos-u55-128]")
    (root / "configs" / "kws.yaml").write_text(spec)
    shutil.copy(REPO / "configs" / "models" / "ds_cnn.onnx", root / "configs" / "models" / "ds_cnn.onnx")
    from npubuild.cli import main

    old = Path.cwd()
    os.chdir(root)
    try:
        assert main(["build", "-q"]) == 0
    finally:
        os.chdir(old)
    return root


@pytest.fixture
def project_copy(built: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "product"
    shutil.copytree(built, dst)  # copy2: sizes and mtimes kept, ctimes new
    return dst


def _stage_file(project: Path, stage: str, rel: str) -> Path:
    """The one file `rel` (a glob: the vela stage names its outputs after the graph it compiled, model or a
    family's u55_model) of the stage's one task dir."""
    (d,) = (project / "build" / "stages" / stage).iterdir()
    (found,) = d.glob(rel)
    return found


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])


def _flip(p: Path, keep_mtime: bool) -> None:
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x5A
    p.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size


CASES = [  # finding 1: finished outputs (stage, file, how it is damaged)
    ("vela", "*model_vela.tflite", "truncate"),
    ("vela", "firmware/npubuild_model.c", "truncate"),
    ("vela", "summary.json", "truncate"),
    ("tosa-check", "reference.npz", "truncate"),
    ("tosa-check", "numerics.json", "truncate"),
    ("tosa-check", "runs.npz", "truncate"),  # the runs npu-sim takes instead of making them (tosa/memo.py)
    ("tosa-check", "runs.npz", "flip-keep-mtime"),
    ("quantize", "model_qdq.onnx", "flip"),
    ("lower", "model.tosa", "flip-keep-mtime"),
    ("vela", "firmware/npubuild_deployable.tflite", "flip-keep-mtime"),
    # finding 2: truncated intermediates were an internal error until `npubuild clean`
    ("lower", "model.tosa", "truncate"),
    ("import", "model.onnx", "truncate"),
    ("quantize", "model_qdq.onnx", "truncate"),
    ("lower", "io.json", "truncate"),
]


@pytest.mark.parametrize("stage, rel, damage", CASES, ids=[f"{s}/{r}-{d}" for s, r, d in CASES])
def test_a_damaged_output_reruns_its_task_and_is_rebuilt(project_copy: Path, capsys, stage: str, rel: str,
                                                         damage: str):
    target = _stage_file(project_copy, stage, rel)
    good = target.read_bytes()
    if damage == "truncate":
        _truncate(target)
    else:
        _flip(target, keep_mtime=damage == "flip-keep-mtime")
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and target.name in warnings[0] and "rerunning" in warnings[0], err
    assert "Traceback" not in err and "internal error" not in err
    run = read_run(project_copy / "build")
    assert any(n.startswith(f"{stage}:") for n in run["executed"]), run
    assert target.read_bytes() == good
    assert all(b["status"] == "passed" for b in read_report(project_copy / "build")["builds"])
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)  # and then all of it is up to date again
    assert code == 0 and not err and read_run(project_copy / "build")["executed"] == []


def test_a_copied_build_dir_is_rehashed_once_then_checked_by_stat(project_copy: Path, capsys):
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 0 and not err and read_run(project_copy / "build")["executed"] == []
    vela_dir = _stage_file(project_copy, "vela", "summary.json").parent
    saved = json.loads((vela_dir / INPUTS_NAME).read_text())["outputs"]
    assert saved["summary.json"] == stat_signature((vela_dir / "summary.json").stat())  # refreshed after the copy


def test_a_change_no_stat_can_see_fails_its_consumer_once_then_rebuilds(project_copy: Path, capsys):
    """Bit rot: the content of model.tosa changes but its stat signature is as recorded (simulated by
    recording the new signature). lower's own check cannot see it; vela, which hashes its inputs, does."""
    build = project_copy / "build"
    assert run_cli(["build", "-q"], capsys, cwd=project_copy)[0] == 0  # signatures refreshed after the copy
    tosa = _stage_file(project_copy, "lower", "model.tosa")
    good = tosa.read_bytes()
    _flip(tosa, keep_mtime=True)
    inputs = json.loads((tosa.parent / INPUTS_NAME).read_text())
    inputs["outputs"]["model.tosa"] = stat_signature(tosa.stat())
    (tosa.parent / INPUTS_NAME).write_text(json.dumps(inputs))
    (vela_record,) = build.glob("stages/vela/*/stage.json")
    vela_record.unlink()  # vela must run again (as after a target edit) and so reads model.tosa
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 1
    (line,) = [ln for ln in err.splitlines() if "model.tosa" in ln]
    assert "changed on disk after it was built" in line and "Traceback" not in err
    assert not (tosa.parent / "stage.json").exists()  # lower's record dropped: it reruns next time
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 0, err
    assert tosa.read_bytes() == good
    assert {n.split(":")[0] for n in read_run(build)["executed"]} >= {"lower", "vela"}


@pytest.mark.parametrize("stage, record", [("lower", "stage.json"), ("vela", "inputs.json")])
def test_a_record_that_parses_but_is_malformed_reruns_its_task(project_copy: Path, capsys, stage: str,
                                                               record: str):
    """A byte flip can leave a stage's own JSON valid but of the wrong shape (a size that is no longer a
    mapping): one warning and the task reruns, not a traceback in every later build until `npubuild clean`."""
    path = _stage_file(project_copy, stage, record)
    data = json.loads(path.read_text())
    field = "outputs" if record == "stage.json" else "inputs"
    data[field] = {k: 5 for k in data[field]}
    path.write_text(json.dumps(data))
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 0 and "Traceback" not in err, err
    (warning,) = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert f"{stage}:" in warning and "malformed" in warning and "rerunning" in warning, warning
    assert any(n.startswith(f"{stage}:") for n in read_run(project_copy / "build")["executed"])
    assert all(b["status"] == "passed" for b in read_report(project_copy / "build")["builds"])
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project_copy)
    assert code == 0 and not err and read_run(project_copy / "build")["executed"] == []
