"""fvp stage: run the build's deployable .tflite on a Corstone FVP with a user's runner application.

No FVP ships with npubuild (Arm distributes them separately): the stage runs
when one is on PATH or named by `fvp.executable`, and the spec names a runner
ELF (`fvp.runner`). `verify.fvp: auto` then skips with the reason; `required`
fails the build.

The runner protocol (what the runner ELF must do):
- the FVP loads the build's deployable (`firmware/npubuild_deployable.tflite`: Vela's ethos-u operators,
  and TFLite builtins for the host partitions, so the runner is a TensorFlow Lite Micro application with
  the Ethos-U driver and the builtins the manifest lists) at `fvp.model_address` and the input (raw
  bytes in each input's type, int8 or little-endian int16, in the deployable's input layout, one input after
  the other) at `fvp.input_address`, with `--data`;
- the runner prints each output on the UART as `npubuild-output <index> <hex bytes>`;
- it prints the NPU PMU counters as the Ethos-U driver's PMU report does
  (`ethosu_pmu_cycle_cntr : N`, `ethosu_pmu_cntr<i> : N`) or as
  `NPU ACTIVE cycles: N` / `NPU TOTAL cycles: N`;
- it ends with an EOT character (0x04), which stops the FVP (uart0.shutdown_on_eot).
A hard fault, an assertion message or the FVP's own `CPU time has been
exceeded` (its --timelimit) fails the stage.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npubuild.config.accelerator import PLATFORMS
from npubuild.config.schema import FvpOptions
from npubuild.errors import StageError
from npubuild.fileio import write_json, write_text
from npubuild.records.build import Skip
from npubuild.records.fvp import FvpRecord
from npubuild.records.iospec import GraphIO, GraphSpecs, specs_from_json
from npubuild.records.vela import VelaRecord

FAULTS = [
    (re.compile(r"hard ?fault", re.I), "hard fault"),
    (re.compile(r"assert(ion)?\b.*\bfail|\bfailed assertion|^\s*assert(ion)? failed", re.I), "assertion failed"),
    (re.compile(r"CPU time (limit )?(has been )?exceeded", re.I), "CPU time exceeded (FVP --timelimit)"),
]
OUTPUT_RE = re.compile(r"npubuild-output\s+(\d+)\s+([0-9a-fA-F]*)\s*$")
PMU_CYCLE_RE = re.compile(r"ethosu_pmu_cycle_cntr\s*:\s*(\d+)", re.I)
PMU_CNTR_RE = re.compile(r"ethosu_pmu_cntr(\d+)\s*:\s*(\d+)", re.I)
NPU_CYCLES_RE = re.compile(r"NPU\s+(ACTIVE|TOTAL|IDLE)\s*(?:cycles)?\s*:\s*(\d+)", re.I)


def fvp_command(exe: Path, platform: str, macs: int, runner: Path, model: Path, inputs: Path,
                model_address: int, input_address: int, timeout_s: int) -> list[str]:
    """The FVP's argv: MAC count, no visualisation, no telnet, UART0 to stdout, stop on EOT, time limit."""
    facts = PLATFORMS[platform]
    board = facts.board
    params = [
        f"{facts.macs_param}={macs}",
        f"{board}.visualisation.disable-visualisation=1",
        f"{board}.telnetterminal0.start_telnet=0",
        f"{board}.uart0.out_file=-",
        f"{board}.uart0.shutdown_on_eot=1",
    ]
    params += facts.headless
    cmd = [str(exe)]
    for p in params:
        cmd += ["-C", p]
    cmd += ["-a", str(runner),
            "--data", f"{facts.data_target}={model}@{model_address:#x}",
            "--data", f"{facts.data_target}={inputs}@{input_address:#x}",
            "--timelimit", str(timeout_s)]
    return cmd


@dataclass
class UartLog:
    outputs: dict[int, bytes] = field(default_factory=dict)
    pmu: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    @property
    def npu_cycles(self) -> int | None:
        for key in ("cycle_cntr", "npu_total", "npu_active"):
            if key in self.pmu:
                return self.pmu[key]
        return None


def parse_uart(text: str) -> UartLog:
    """Outputs, PMU counters and fault lines from the FVP's UART/stdout log."""
    log = UartLog()
    for line in text.splitlines():
        line = line.strip().strip("\x04")
        m = OUTPUT_RE.search(line)
        if m:
            try:
                log.outputs[int(m.group(1))] = bytes.fromhex(m.group(2))
            except ValueError:
                log.faults.append(f"malformed output line: {line[:80]}")
            continue
        if (m := PMU_CYCLE_RE.search(line)) is not None:
            log.pmu["cycle_cntr"] = int(m.group(1))
        elif (m := PMU_CNTR_RE.search(line)) is not None:
            log.pmu[f"cntr{m.group(1)}"] = int(m.group(2))
        elif (m := NPU_CYCLES_RE.search(line)) is not None:
            log.pmu[f"npu_{m.group(1).lower()}"] = int(m.group(2))
        for pattern, what in FAULTS:
            if pattern.search(line):
                log.faults.append(f"{what}: {line[:120]}")
                break
    return log


def input_bytes(io: GraphIO, reference: dict[str, np.ndarray]) -> bytes:
    """The reference sample's inputs as the NPU takes them: quantised, NHWC, concatenated."""
    return b"".join(spec.to_tosa(reference[f"input_{spec.onnx_name}"]).astype(np.dtype(spec.dtype).newbyteorder("<"))
                    .tobytes() for spec in io.inputs)


def compare(io: GraphIO, reference: dict[str, np.ndarray], got: dict[int, bytes]) -> dict:
    """Max difference in LSB of every output the runner printed against the TOSA reference model's."""
    per_output = {}
    for i, spec in enumerate(io.outputs):
        if i not in got:
            raise StageError(f"the runner printed no output {i} ('{spec.onnx_name}'): expected a line "
                             f"'npubuild-output {i} <hex>'")
        arr = np.frombuffer(got[i], dtype=np.dtype(spec.dtype).newbyteorder("<"))  # the device is little-endian
        if arr.size != spec.size:
            raise StageError(f"output {i} has {arr.size} elements on the FVP, expected {spec.size}")
        y = spec.from_tosa(arr.reshape(spec.shape))
        ref = reference[f"output_{spec.onnx_name}"]
        per_output[spec.onnx_name] = float(np.max(np.abs(y.astype(np.int64) - ref.astype(np.int64))))
    return per_output


@dataclass(frozen=True)
class FvpSetup:
    """Which FVP runs the model and how: the platform (its command line), the NPU's MAC count, the FVP
    executable, the spec's fvp options and whether `verify.fvp` is `required` (else a model the FVP stage
    cannot run is skipped with the reason)."""

    platform: str
    macs: int
    executable: Path
    options: FvpOptions
    required: bool


@dataclass(frozen=True)
class FvpFiles:
    """What the FVP stage reads: Vela's summary.json (the Vela model beside it), the lower stage's io.json,
    tosa-check's reference.npz (the input it feeds and the outputs it compares) and the runner ELF."""

    vela_summary: Path
    io: Path
    reference: Path
    runner: Path


def run_on_fvp(setup: FvpSetup, files: FvpFiles, stage_dir: Path, log_out: Path, result_out: Path) -> dict:
    """The fvp stage's work: the Vela model and the reference input on the FVP with the runner, its outputs
    compared with the TOSA reference model's; fvp.json (returned, the stage's metrics)."""
    platform, macs, exe = setup.platform, setup.macs, setup.executable
    if platform not in PLATFORMS:
        raise StageError(f"verify.fvp: no FVP command line known for platform '{platform}'")
    vela = VelaRecord.read(files.vela_summary)
    deployable = vela.metrics.get("deployable")
    if not deployable:
        why = "the build has no deployable .tflite (a host partition TFLite Micro cannot run)"
        if setup.required:
            raise StageError(f"verify.fvp is required but {why}")
        return Skip(why).to_json()
    model = files.vela_summary.parent / deployable["tflite"]
    io = GraphSpecs(tuple(specs_from_json(deployable["inputs"])), tuple(specs_from_json(deployable["outputs"])))
    with np.load(files.reference, allow_pickle=False) as z:
        reference = {k: z[k] for k in z.files}
    inputs = stage_dir / "input.bin"
    inputs.write_bytes(input_bytes(io, reference))
    f = setup.options
    cmd = fvp_command(exe, platform, macs, files.runner, model, inputs, f.model_address, f.input_address, f.timeout_s)
    write_json(stage_dir / "command.json", cmd)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=f.timeout_s + 30,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise StageError(f"FVP did not stop within {f.timeout_s + 30} s (runner never sent EOT?)") from None
    except OSError as exc:
        raise StageError(f"cannot start the FVP {exe}: {exc}") from None
    text = proc.stdout + proc.stderr
    write_text(log_out, text)
    log = parse_uart(text)
    if log.faults:
        raise StageError(f"FVP run failed: {log.faults[0]} (log: {log_out})")
    if proc.returncode != 0:
        raise StageError(f"FVP exited with status {proc.returncode} (log: {log_out})")
    errors = compare(io, reference, log.outputs)
    ratio = (log.npu_cycles / vela.npu_cycles) if log.npu_cycles and vela.npu_cycles else None
    metrics = FvpRecord(None, exe.name, log.npu_cycles, vela.npu_cycles, ratio, log.pmu,
                        max(errors.values()) if errors else None, errors).to_json()
    write_json(result_out, metrics)
    return metrics
