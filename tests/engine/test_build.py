"""The walking skeleton end to end: build, cache, and exactly which tasks a profile edit re-runs."""

from __future__ import annotations

import json
from pathlib import Path

from npbtest import REPO, read_report, read_run, run_cli, run_subprocess

CONTRACT_METRICS = {"npu_ops", "cpu_ops", "npu_offload", "sram_kib", "offchip_kib", "inference_ms", "npu_cycles",
                    "macs", "tosa_max_error_lsb", "tosa_snr_db", "quant_snr_db"}


def test_example_builds_pass_and_rebuild_is_fully_cached(project: Path, capsys):
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 0, err
    report = read_report(build_dir)
    builds = report["builds"]
    assert {b["target"] for b in builds} == {"ethos-u55-128", "ethos-u65-256", "ethos-u85-256"}
    for b in builds:
        assert b["status"] == "passed"
        m = b["metrics"]
        assert CONTRACT_METRICS <= set(m)
        assert m["npu_offload"] == 1.0 and m["cpu_ops"] == 0
        assert m["tosa_max_error_lsb"] <= 1
        assert m["transposes"] == 0
        assert m["sram_kib"] > 0 and m["npu_cycles"] > 0 and m["macs"] > 0
        assert all(g["ok"] for g in b["gates"])
        assert {s: v["status"] for s, v in b["stages"].items() if s not in ("fvp", "npu-sim")} == dict.fromkeys(
            ("import", "early-fit", "quantize", "lower", "tosa-check", "vela", "report"), "passed")
    first = read_run(build_dir)
    # import, early-fit, quantize, lower and tosa-check are shared by the three targets: 5 + 3 vela + 3 npu-sim + 3 report
    assert len(first["executed"]) == 14 and not first["cached"]

    code, _, _ = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 0
    again = read_run(build_dir)
    assert again["executed"] == [] and len(again["cached"]) == 14
    for b in read_report(build_dir)["builds"]:
        assert all(s["cached"] for k, s in b["stages"].items() if k not in ("fvp", "npu-sim"))


def test_editing_one_profile_reruns_only_its_vela_and_report(project: Path, capsys):
    (project / "targets").mkdir()
    local = project / "targets" / "ethos-u55-128.yaml"
    local.write_text("extends: ethos-u55-128\n")  # the product's own copy of the shipped profile
    build_dir = project / "build"
    assert run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)[0] == 0
    before = read_report(build_dir)

    local.write_text("extends: ethos-u55-128\nclock_mhz: 250\n")
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 0, err
    run = read_run(build_dir)
    assert len(run["executed"]) == 3, run  # its vela, the npu-sim run of that artifact, its report
    assert run["executed"][0].startswith("npu-sim:ds_cnn-ethos-u55-128-")
    assert run["executed"][1] == "report:kws/ds_cnn/ethos-u55-128"
    assert run["executed"][2].startswith("vela:ds_cnn-ethos-u55-128-")
    after = {b["target"]: b for b in read_report(build_dir)["builds"]}
    old = {b["target"]: b for b in before["builds"]}
    # half the clock: the same cycles take about twice as long
    assert after["ethos-u55-128"]["metrics"]["inference_ms"] > 1.5 * old["ethos-u55-128"]["metrics"]["inference_ms"]
    assert after["ethos-u85-256"]["metrics"] == old["ethos-u85-256"]["metrics"]


def test_compile_json_prints_one_report_entry(tmp_path: Path):
    proc = run_subprocess(["compile", str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target", "ethos-u55-128",
                           "--build-dir", str(tmp_path / "b"), "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)
    assert entry["target"] == "ethos-u55-128" and entry["status"] == "passed"
    assert CONTRACT_METRICS <= set(entry["metrics"])
    assert entry["metrics"]["npu_offload"] == 1.0


def test_doit_runs_the_same_graph_and_shares_the_cache(project: Path, capsys):
    import shutil
    import subprocess
    import sys

    build_dir = project / "build"
    assert run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)[0] == 0
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    env = {"NPUBUILD_BUILD_DIR": str(build_dir), "PATH": str(Path(sys.executable).parent),
           "PYTHONPATH": str(REPO)}  # this checkout's npubuild (a worktree's, not the venv's editable install)
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", "2"], cwd=project, capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = read_run(build_dir)
    assert run["executed"] == [] and len(run["cached"]) == 14


def test_parallel_cold_build_with_doit_jobs(project: Path, capsys):
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q", "-n", "2"], capsys, cwd=project)
    assert code == 0, err
    assert all(b["status"] == "passed" for b in read_report(build_dir)["builds"])


def test_impossible_gate_fails_with_exit_1_naming_it(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("min_tosa_snr_db: 30", "min_tosa_snr_db: 30\n  max_inference_ms: 0.000001"))
    code, out, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    assert code == 1
    report = read_report(project / "build")
    for b in report["builds"]:
        assert b["status"] == "failed"
        bad = [g for g in b["gates"] if not g["ok"]]
        assert [g["name"] for g in bad] == ["max_inference_ms"] and bad[0]["value"] > bad[0]["limit"]
