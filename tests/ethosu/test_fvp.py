"""The FVP stage. No Corstone FVP can be installed on these machines, so these tests run the stage against a
stand-in executable written here: it takes the FVP's command line, records it, and prints what a real FVP
running an npubuild runner prints on its UART (banner, PMU counters, outputs, EOT, the SystemC stop line).
They test npubuild's command line, log parsing, output comparison and skip/fail logic, not a real FVP."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from npbtest import read_report, run_cli

from npubuild.ethosu.fvp import fvp_command, parse_uart

STAND_IN = f"""#!{sys.executable}
# Stand-in for a Corstone FVP (none can be installed here): records argv, prints the runner's scripted UART.
import json, sys
args = sys.argv[1:]
app = args[args.index("-a") + 1]
script = json.load(open(app))
json.dump(args, open(app + ".argv.json", "w"))
print("telnetterminal0: Listening for serial connection on port 5000")
for line in script["uart"]:
    print(line)
print("\\x04", end="")
print("Info: /OSCI/SystemC: Simulation stopped by user.")
sys.exit(script.get("exit", 0))
"""

BANNER = ["Ethos-U rev 136b7d75 --- Apr 12 2023 13:44:01", "    (C) COPYRIGHT 2019-2023 Arm Limited",
          "I: Running inference on model at 0x90000000"]


def _project(project: Path, fvp: str = "auto", runner: bool = True, extra: str = "") -> Path:
    spec = project / "configs" / "kws.yaml"
    text = spec.read_text().replace("targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]", "targets: [ethos-u55-128]")
    text = text.replace("fvp: auto", f"fvp: {fvp}") + extra
    if runner:
        text += "fvp: {runner: runner.elf, timeout_s: 60}\n"
        (project / "configs" / "runner.elf").write_text(json.dumps({"uart": []}))
    spec.write_text(text)
    return project / "configs" / "runner.elf"


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch) -> Path:
    bindir = tmp_path / "fvpbin"
    bindir.mkdir()
    exe = bindir / "FVP_Corstone_SSE-300_Ethos-U55"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return exe


def _build(project: Path, capsys) -> tuple[int, str, dict]:
    code, _, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    (b,) = read_report(project / "build")["builds"]
    return code, err, b


def _expected_output_lines(project: Path, delta: int = 0) -> list[str]:
    """What a correct NPU prints: the TOSA reference model's int8 outputs of the reference sample."""
    (ref,) = (project / "build" / "stages" / "tosa-check").glob("*/reference.npz")
    with np.load(ref) as z:
        out = [z[k] for k in z.files if k.startswith("output_")]
    lines = []
    for i, y in enumerate(out):
        y = y.astype(np.int16)
        v = int(y.reshape(-1)[0])
        y.reshape(-1)[0] = v + delta if v + delta <= 127 else v - delta  # off by `delta` LSB, still int8
        lines.append(f"npubuild-output {i} {y.astype(np.int8).tobytes().hex()}")
    return lines


def test_auto_without_fvp_skips_with_one_line_why(project: Path, capsys):
    _project(project)
    code, err, b = _build(project, capsys)
    assert code == 0, err
    assert b["status"] == "passed"
    fvp = b["stages"]["fvp"]
    assert fvp["status"] == "skipped"
    assert fvp["reason"] == ("no FVP found (FVP_Corstone_SSE-300_Ethos-U55 is not on PATH and fvp.executable "
                             "is not set)")


def test_required_without_fvp_fails_with_one_clear_line(project: Path, capsys):
    _project(project, fvp="required")
    code, err, b = _build(project, capsys)
    assert code == 1
    assert b["status"] == "failed" and b["stages"]["fvp"]["status"] == "failed"
    lines = [ln for ln in err.splitlines() if "FVP" in ln]
    assert lines == ["error: kws/ds_cnn/ethos-u55-128: fvp: verify.fvp is required but no FVP found "
                     "(FVP_Corstone_SSE-300_Ethos-U55 is not on PATH and fvp.executable is not set)"]


def test_auto_with_fvp_but_no_runner_skips(project: Path, stand_in: Path, capsys):
    _project(project, runner=False)
    code, err, b = _build(project, capsys)
    assert code == 0, err
    assert b["stages"]["fvp"]["reason"].startswith("no runner application configured")


def test_fvp_run_command_line_outputs_and_cycles(project: Path, stand_in: Path, capsys):
    runner = _project(project, extra="  max_fvp_error_lsb: 0\n")
    code, err, _ = _build(project, capsys)  # the runner prints nothing yet
    assert code == 1 and "the runner printed no output 0" in err
    runner.write_text(json.dumps({"uart": BANNER + ["ethosu_pmu_cycle_cntr : 91234", "ethosu_pmu_cntr0 : 4321",
                                                    "NPU ACTIVE cycles: 90000", *_expected_output_lines(project)]}))
    code, err, b = _build(project, capsys)
    assert code == 0, err
    assert b["stages"]["fvp"]["status"] == "passed"
    m = b["metrics"]
    assert m["fvp_npu_cycles"] == 91234 and m["fvp_max_error_lsb"] == 0
    assert m["fvp_vs_vela_cycles"] == pytest.approx(91234 / m["npu_cycles"])
    argv = json.loads(Path(str(runner) + ".argv.json").read_text())
    params = [argv[i + 1] for i, a in enumerate(argv) if a == "-C"]
    assert "ethosu.num_macs=128" in params
    assert "mps3_board.visualisation.disable-visualisation=1" in params
    assert "mps3_board.telnetterminal0.start_telnet=0" in params
    assert "mps3_board.uart0.out_file=-" in params and "mps3_board.uart0.shutdown_on_eot=1" in params
    assert argv[argv.index("--timelimit") + 1] == "60"
    assert argv[argv.index("-a") + 1] == str(runner.resolve())
    data = [argv[i + 1] for i, a in enumerate(argv) if a == "--data"]
    model = Path(data[0].split("=", 1)[1].rsplit("@", 1)[0])
    assert data[0].endswith("@0x90000000") and model.name == "npubuild_deployable.tflite"
    assert model.read_bytes()[4:8] == b"TFL3"  # the build's deployable (here Vela's own .tflite), not the .tosa
    inp = Path(data[1].split("=", 1)[1].rsplit("@", 1)[0])
    assert inp.stat().st_size == 49 * 10  # one int8 sample, NHWC


def test_fvp_output_mismatch_fails_its_gate(project: Path, stand_in: Path, capsys):
    runner = _project(project, extra="  max_fvp_error_lsb: 1\n")
    _build(project, capsys)
    runner.write_text(json.dumps({"uart": ["ethosu_pmu_cycle_cntr : 5", *_expected_output_lines(project, 3)]}))
    code, err, b = _build(project, capsys)
    assert code == 1
    assert "gate max_fvp_error_lsb failed: fvp_max_error_lsb = 3, limit 1" in err


@pytest.mark.parametrize("line,what", [
    ("HardFault_Handler: hard fault at 0x1000", "hard fault"),
    ("Assertion failed: (tensor != NULL), file main.cpp, line 42", "assertion failed"),
    ("Info: Simulation is stopping. Reason: CPU time has been exceeded.", "CPU time exceeded"),
])
def test_fvp_faults_fail_the_stage(project: Path, stand_in: Path, capsys, line: str, what: str):
    runner = _project(project)
    _build(project, capsys)
    runner.write_text(json.dumps({"uart": BANNER + [line]}))
    code, err, b = _build(project, capsys)
    assert code == 1 and b["stages"]["fvp"]["status"] == "failed"
    assert f"FVP run failed: {what}" in err and err.count("\n") == 1


def test_parse_uart_reads_counters_outputs_and_faults():
    log = parse_uart("\n".join(["I: start", "ethosu_pmu_cycle_cntr : 1200", "ethosu_pmu_cntr1 : 7",
                                "NPU TOTAL cycles: 1300", "npubuild-output 1 ff0080", "npubuild-output 0 01"]))
    assert log.pmu == {"cycle_cntr": 1200, "cntr1": 7, "npu_total": 1300}
    assert log.npu_cycles == 1200 and log.outputs == {0: b"\x01", 1: b"\xff\x00\x80"} and not log.faults
    assert parse_uart("NPU ACTIVE cycles: 900").npu_cycles == 900
    assert parse_uart("random text\nok").faults == []


def test_u85_command_line_uses_the_corstone_320_fvp(tmp_path: Path):
    cmd = fvp_command(Path("/opt/FVP_Corstone_SSE-320"), "corstone-320", 256, Path("r.elf"), Path("m.tflite"),
                      Path("i.bin"), 0x90000000, 0x92000000, 120)
    params = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-C"]
    assert "mps4_board.subsystem.ethosu.num_macs=256" in params
    assert "mps4_board.visualisation.disable-visualisation=1" in params and "vis_hdlcd.disable_visualisation=1" in params
    assert "mps4_board.telnetterminal0.start_telnet=0" in params and "mps4_board.uart0.out_file=-" in params
    assert cmd[-2:] == ["--timelimit", "120"]


def test_configured_executable_relative_to_the_spec_is_used(project: Path, tmp_path: Path, capsys):
    runner = _project(project)
    tools = project / "tools"
    tools.mkdir()
    exe = tools / "my_fvp"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("fvp: {runner: runner.elf,", "fvp: {runner: runner.elf, executable: ../tools/my_fvp,"))
    _build(project, capsys)
    runner.write_text(json.dumps({"uart": ["NPU ACTIVE cycles: 77", *_expected_output_lines(project)]}))
    code, err, b = _build(project, capsys)
    assert code == 0, err
    assert b["metrics"]["fvp_npu_cycles"] == 77 and Path(str(runner) + ".argv.json").is_file()


def test_a_split_model_runs_its_deployable_on_the_fvp(project: Path, stand_in: Path, capsys):
    """Greater and Where run on the host on U55: the FVP gets the one deployable (two ethos-u operators and the
    TFLite builtins of the host partition) and its outputs are compared in the deployable's layout."""
    from npbtest.builds import add_compare_model

    runner = project / "configs" / "runner.elf"
    runner.write_text(json.dumps({"uart": []}))
    spec = add_compare_model(project, targets="[ethos-u55-128]")
    spec.write_text(spec.read_text().replace("samples: 4}", "samples: 4, fvp: required}")
                    + "fvp: {runner: runner.elf}\n")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 1 and "the runner printed no output 0" in err  # it ran: the runner prints nothing yet
    (summary,) = (project / "build" / "stages" / "vela").glob("*/summary.json")
    out_spec = json.loads(summary.read_text())["deployable"]["outputs"][0]
    (ref,) = (project / "build" / "stages" / "tosa-check").glob("*/reference.npz")
    with np.load(ref) as z:
        y = np.transpose(z["output_y"], out_spec["perm"]).astype(np.int8)
    runner.write_text(json.dumps({"uart": [f"npubuild-output 0 {y.tobytes().hex()}"]}))
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 0, err
    (b,) = read_report(project / "build")["builds"]
    assert b["stages"]["fvp"]["status"] == "passed" and b["metrics"]["fvp_max_error_lsb"] <= 1
    argv = json.loads(Path(str(runner) + ".argv.json").read_text())
    model = Path([argv[i + 1] for i, a in enumerate(argv) if a == "--data"][0].split("=", 1)[1].rsplit("@", 1)[0])
    assert model.name == "npubuild_deployable.tflite" and model.parent.name == "firmware"


def test_int16_inputs_and_outputs_cross_the_fvp_as_little_endian_pairs():
    """A 16x8 build's int16 I/O: two little-endian bytes an element each way (a value past int8 survives)."""
    from npubuild.ethosu.fvp import compare, input_bytes
    from npubuild.records.iospec import GraphSpecs, IOSpec

    spec_in = IOSpec("x", "x0", (1, 3), (0, 1), "int16", 0.001, 0)
    spec_out = IOSpec("y", "y0", (1, 2), (0, 1), "int16", 0.01, 0)
    io = GraphSpecs((spec_in,), (spec_out,))
    reference = {"input_x": np.array([[0.3, -1.0, 0.001]], np.float32), "output_y": np.array([[300, -2]], np.int16)}
    assert input_bytes(io, reference) == np.array([300, -1000, 1], "<i2").tobytes()
    assert compare(io, reference, {0: np.array([301, -2], "<i2").tobytes()}) == {"y": 1.0}
