"""A run that stops early (the first failure without --keep-going) reports every build it did not finish as not
built, with the reason, in report.json, report.md, the HTML, run.json and the summary line: never as passed
from an earlier run's records, whose inputs this run did not check (issue 34: a model edited in place kept its
old SNR and sha256 under `passed`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, read_run, run_cli
from npbtest.builds import conv_chain_model, write_spec
from onnx import numpy_helper

SMALL_SRAM = "[{extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 16}}}]"


def _project(root: Path) -> Path:
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(conv_chain_model(48), root / "configs" / "models" / "big.onnx")
    onnx.save(conv_chain_model(8, 8), root / "configs" / "models" / "small.onnx")
    write_spec(root, "a_too_big", "big.onnx", [1, 4, 48, 48], SMALL_SRAM)  # fails at early-fit, and comes first
    write_spec(root, "b_fine", "small.onnx", [1, 4, 8, 8], "[ethos-u55-128]")
    return root


def _scale_first_weight(path: Path, factor: float) -> None:
    model = onnx.load(str(path))
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(w) * factor).astype(np.float32), w.name))
    onnx.save(model, path)


def test_a_run_stopped_by_a_failure_reports_the_builds_it_did_not_reach_as_not_built(tmp_path: Path, capsys):
    root = _project(tmp_path / "p")
    build = root / "build"
    args = ["build", "--progress", "plain", "--cache", "off", "--build-dir", str(build)]
    code, _, _ = run_cli([*args, "--keep-going"], capsys, cwd=root)
    assert code == 1
    before = {b["spec"]: b for b in read_report(build)["builds"]}
    assert before["a_too_big"]["status"] == "failed" and before["b_fine"]["status"] == "passed"
    old_sha = before["b_fine"]["inputs"]["model_sha256"]
    assert old_sha and before["b_fine"]["metrics"]["tosa_snr_db"] is not None

    _scale_first_weight(root / "configs" / "models" / "small.onnx", 1.5)  # same spec, same keys: a new model
    code, out, err = run_cli(args, capsys, cwd=root)  # no --keep-going: it stops at a_too_big's failure
    assert code == 1, err
    after = {b["spec"]: b for b in read_report(build)["builds"]}
    b = after["b_fine"]
    assert b["status"] == "skipped", b["status"]
    planned = {k: s for k, s in b["stages"].items() if "reason" not in s}  # not the FVP (no FVP here)
    assert planned and all(s["status"] == "skipped" and "stopped at the first failure" in s["not_run"]
                           for s in planned.values()), b["stages"]
    assert b["inputs"]["model_sha256"] is None  # not the old model's
    assert all(v is None for k, v in b["metrics"].items() if k in ("tosa_snr_db", "inference_ms", "sram_kib"))
    assert "builds: 0 passed, 1 failed, 1 skipped" in out
    assert "not built (1 build(s)" in out and "--keep-going builds the rest" in out
    run = read_run(build)
    assert "report:b_fine/m/ethos-u55-128" in run["not_run"] and "report:a_too_big/m/u55-tiny" in run["not_run"]
    assert not set(run["not_run"]) & set(run["cached"] + run["executed"])
    md = (build / "report.md").read_text()
    assert "| b_fine | m | ethos-u55-128 | skipped |" in md and "stopped at the first failure" in md
    html = (build / "report.html").read_text()
    assert "b_fine" in html and "stopped at the first failure" in html

    code, _, _ = run_cli([*args, "--keep-going"], capsys, cwd=root)  # built this time: the new model's figures
    b = {e["spec"]: e for e in read_report(build)["builds"]}["b_fine"]
    assert b["status"] == "passed" and b["inputs"]["model_sha256"] not in (None, old_sha)


def test_a_blocked_stage_never_shows_an_earlier_runs_record(tmp_path: Path, capsys):
    """With --keep-going, a stage whose upstream task failed is not built this run, even where its record of an
    earlier run carries its current key (the keys are made from configs, not from the inputs' content)."""
    root = _project(tmp_path / "p")
    build = root / "build"
    args = ["build", "--progress", "plain", "--cache", "off", "--keep-going", "--build-dir", str(build),
            "--only", "b_fine"]
    assert run_cli(args, capsys, cwd=root)[0] == 0
    (root / "configs" / "models" / "small.onnx").write_bytes(b"not an onnx model")  # the import now fails
    code, _, err = run_cli(args, capsys, cwd=root)
    assert code == 2, err
    b = read_report(build)["builds"][0]
    assert b["status"] == "failed" and b["stages"]["import"]["status"] == "failed"
    later = {k: s for k, s in b["stages"].items() if k != "import" and "reason" not in s}
    assert all(s["status"] == "skipped" and s["not_run"].startswith("its upstream task import:") for s in later.values())
    assert b["metrics"].get("tosa_snr_db") is None and b["inputs"]["model_sha256"] is None
