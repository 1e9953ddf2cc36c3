"""Memory pools proved with exact numbers: one model, cascading on and off, two SRAM sizes.

The figures npubuild reports and checks are Vela's own: its summary's SRAM use
and its compiled operator's arena (the scratch tensor of the ethos-u operator) agree to the byte, the golden
numbers below are what Vela 5.2 reports for this model, and the one case that
does not fit (no cascading, 64 KiB of SRAM) fails the build with one line
naming the pool, the KiB needed and the KiB available, losing nothing built.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
from npbtest import read_report, read_run, run_cli
from npbtest.builds import conv_chain_model, write_spec

from npubuild.engine.versions import versions
from npubuild.npusim.tflite import npu_operators


def _vela_operator(stage_dir: Path):
    """The arena, constants and command stream bytes of the stage's Vela .tflite (its one ethos-u operator)."""
    path = next(stage_dir.glob("*_vela.tflite"))
    (op,) = npu_operators(path.read_bytes(), str(path))
    return op.model.scratch_size, len(op.model.weights), len(op.payload)

TARGETS = ("[{extends: ethos-u55-128, name: u55-sram2m},"
           " {extends: ethos-u55-128, name: u55-sram64k, pools: {sram: {size_kib: 64}}}]")
# (cascading, target) -> arena bytes Vela 5.2 allocates in SRAM for conv_chain_model()
GOLDEN_VELA = "5.2"
GOLDEN = {("on", "u55-sram2m"): 79440, ("on", "u55-sram64k"): 61216,
          ("off", "u55-sram2m"): 73728, ("off", "u55-sram64k"): 73728}


def _vela_log_sram_kib(stage_dir: Path) -> float:
    text = next(stage_dir.glob("*vela.log")).read_text()  # vela.log, or <family>_model.vela.log
    return float(re.search(r"Total SRAM used\s+([\d.]+) KiB", text).group(1))


def test_cascading_and_sram_size_give_exact_sram_figures_and_a_too_small_pool_fails(project: Path, capsys):
    onnx.save(conv_chain_model(), project / "configs" / "models" / "chain.onnx")
    for mode, flag in (("on", "true"), ("off", "false")):
        write_spec(project, f"cascade_{mode}", "chain.onnx", [1, 4, 48, 48], TARGETS,
                   extra=f"vela: {{cascading: {flag}}}\n")
    (project / "configs" / "kws.yaml").unlink()
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q", "--keep-going"], capsys, cwd=project)
    assert code == 1
    pool_lines = [ln for ln in err.splitlines() if "pool 'sram'" in ln]
    assert len(pool_lines) == 1, err
    assert re.search(r"target 'u55-sram64k': pool 'sram' \(sram\) needs 72\.0 KiB \(arena 72\.0 KiB\) "
                     r"but has 64\.0 KiB", pool_lines[0]), pool_lines[0]

    builds = {(b["spec"].split("_")[1], b["target"]): b for b in read_report(build_dir)["builds"]}
    figures = {}
    for key, b in builds.items():
        if b["status"] == "passed":
            vela_dir = Path(b["artifacts"]["vela"]).parent
        else:  # the failed task: no completion record, its outputs kept for inspection
            vela_dir = next(d for d in (build_dir / "stages" / "vela").glob(f"m-{key[1]}-*")
                            if not (d / "stage.json").exists())
        if key == ("off", "u55-sram64k"):
            assert b["status"] == "failed"
        else:
            assert b["status"] == "passed", b["errors"]
        # our figures are Vela's: summary SRAM == log SRAM == its arena size / 1024 (Shared_Sram: arena in SRAM)
        arena, weights, cmd = _vela_operator(vela_dir)
        assert round(arena / 1024, 2) == _vela_log_sram_kib(vela_dir)
        if b["status"] == "passed":
            m = b["metrics"]
            assert m["sram_kib"] == round(arena / 1024, 3)
            sram = next(p for p in m["pools"] if p["pool"] == "sram")
            assert sram["roles"] == {"arena": round(arena / 1024, 3)} and sram["fits"]
            assert m["memory"]["arena_bytes"] == arena
            # the flash holds the weights and the command stream beside them (Vela's off-chip figure: weights only)
            flash = next(p for p in m["pools"] if p["pool"] == "flash")
            assert flash["roles"] == {"constants": round(weights / 1024, 3), "command_stream": round(cmd / 1024, 3)}
            assert flash["used_kib"] == round((weights + cmd) / 1024, 3) and cmd > 0
            assert m["offchip_kib"] == round(weights / 1024, 3)
        figures[key] = arena
    # what Vela does with the pool it is given: cascading trades buffering for a smaller arena when SRAM is short,
    # without cascading the arena cannot shrink and does not fit 64 KiB
    assert figures[("on", "u55-sram64k")] <= 64 * 1024 < figures[("off", "u55-sram64k")]
    assert figures[("on", "u55-sram64k")] < figures[("on", "u55-sram2m")]
    assert figures[("off", "u55-sram64k")] == figures[("off", "u55-sram2m")]
    if versions(("ethos-u-vela",))["ethos-u-vela"].startswith(GOLDEN_VELA):
        assert figures == GOLDEN

    # nothing already built is lost: a second run re-runs only the failed Vela task (and its report)
    code, _, _ = run_cli(["build", "--build-dir", str(build_dir), "-q", "--keep-going"], capsys, cwd=project)
    assert code == 1
    executed = read_run(build_dir)["executed"]
    assert {t.split(":")[0] for t in executed} <= {"vela", "report"}
    assert all("u55-sram64k" in t for t in executed) and len(executed) <= 2


def test_constants_that_do_not_fit_their_pool_fail_naming_it(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace(
        "targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]",
        "targets: [{extends: ethos-u55-128, name: u55-small-flash, pools: {flash: {size_kib: 16}}}]"))
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 1
    line = err.strip().splitlines()[-1]
    _, weights, cmd = _vela_operator(next((build_dir / "stages" / "vela").iterdir()))
    weights, cmd = weights / 1024, cmd / 1024
    # the command stream is a const array beside the weights in the firmware: the flash holds both
    assert (f"pool 'flash' (off_chip_flash) needs {weights + cmd:.1f} KiB (constants {weights:.1f} KiB, "
            f"command_stream {cmd:.1f} KiB) but has 16.0 KiB") in line
