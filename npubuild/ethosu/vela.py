"""vela stage: compile each NPU partition's TOSA graph with Vela for one target, check memory, emit firmware.

Per NPU partition Vela runs once, with the profile's (or spec's) options,
`--verbose-performance` (its per-layer CSV) and `--output-format tflite`: the
deployable is made of that file's ethos-u operator, and its command stream,
constants, arena and fast-scratch sizes and I/O placement (ethosu/artifact.py)
are what the pool check and the firmware files read. A spec asking for Vela's
raw output gets the .npz written from the same compile (the .tflite then sits
in tflite/). One compile where there were two: the stage's CPU -26% on the real models
(bench/vela_stage.md).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO

# imported with this module, so the build process's preload has it for every Vela fork (_vela_child)
from ethosu.vela import vela as ethosu_vela

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import TargetProfile, VelaOptions
from npubuild.deploy.package import package
from npubuild.errors import PoolsTooSmall, StageError
from npubuild.ethosu.artifact import VelaArtifact
from npubuild.ethosu.firmware import write_deployment, write_firmware
from npubuild.ethosu.perf import attach_bytes, parse_layer_bytes, parse_per_layer, roofline, top_layers
from npubuild.ethosu.pools import pool_failure, pool_usage
from npubuild.ethosu.vela_cache import Action, VelaCache
from npubuild.ethosu.vela_ini import MEMORY_MODE, memory_mode_name, render_ini, system_config_name
from npubuild.fileio import write_json, write_text
from npubuild.records.iospec import specs_to_json
from npubuild.records.lower import LowerRecord, PartitionRecord
from npubuild.records.vela import vela_stem

VELA_TIMEOUT_S = 1800


def vela_command(tosa: Path, ini: Path, out_dir: Path, profile: TargetProfile, opts: VelaOptions,
                 output_format: str | None = None) -> list[str]:
    """The full Vela command line, as a list (never through a shell)."""
    cmd = [sys.executable, "-m", "ethosu.vela", str(tosa),
           "--config", str(ini),
           "--system-config", system_config_name(profile.accelerator),
           "--memory-mode", MEMORY_MODE,
           "--accelerator-config", profile.accelerator,
           "--optimise", opts.optimise,
           "--tensor-allocator", opts.tensor_allocator,
           "--output-format", output_format or opts.output_format,
           "--output-dir", str(out_dir)]
    if not opts.cascading:
        cmd.append("--disable-cascading")
    cmd.extend(opts.extra_flags)
    return cmd


def stage_command(tosa: Path, ini: Path, out_dir: Path, profile: TargetProfile, opts: VelaOptions) -> list[str]:
    """The vela stage's command line: tflite output, the per-layer CSV (--verbose-performance) and the debug
    database, which has the bytes per layer and memory the roofline needs (perf.parse_layer_bytes); neither
    changes what Vela compiles. The measured choices compile with it too where a Vela cache keeps their
    compiles (ethosu/vela_cache.py): the same command line on the same graph is then the same key."""
    return vela_command(tosa, ini, out_dir, profile, opts, "tflite") + ["--verbose-performance", "--enable-debug-db"]


def parse_operator_counts(stdout: str) -> tuple[int, int]:
    cpu = re.search(r"CPU operators\s*=\s*(\d+)", stdout)
    npu = re.search(r"NPU operators\s*=\s*(\d+)", stdout)
    return (int(npu.group(1)) if npu else 0, int(cpu.group(1)) if cpu else 0)


def parse_summary_csv(path: Path) -> dict[str, str]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise StageError(f"Vela wrote an empty summary {path.name}")
    return rows[0]


def _vela_child(argv: list[str], out_fd: int, err_fd: int) -> int:
    """In a forked child: Vela's own main() on `argv` with its stdout/stderr in the given files; its exit code.
    Vela is imported once by the build process (preload) rather than by a fresh interpreter per compile: its
    import is ~0.3 CPU s, as much as compiling a small model (bench/compile_speed.md)."""
    import traceback
    import warnings

    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - this process's stdout until it exits
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - (the stage's own may be a capture)
    warnings.simplefilter("ignore")
    code = 1
    try:
        code = int(ethosu_vela.main(argv) or 0)
    except SystemExit as exc:  # argparse's refusal, or Vela's own exit
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - Vela's crash, as the subprocess it used to be would print it
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def run_vela_each(cmds: list[list[str]], log_dir: Path, cache: VelaCache | None = None) -> list[subprocess.CompletedProcess]:
    """Vela on each command line at once, each with its own output dir (a caller with independent compiles
    waits for the slowest, not their sum); each command's outcome, failed or not. Each runs in a forked child
    of this process (vela_command's argv after `python -m ethosu.vela`), or, in a process running other
    threads (a stage run in process by a Dask worker), where a fork without exec may inherit a lock some
    thread holds, as its own interpreter. Output goes to temp files in `log_dir` (the stage's own temp dir, in
    the build dir: the system's temp dir may be another, fuller, disk). With a `cache`, a command compiled
    before (the same graph, .ini and arguments: ethosu/vela_cache.py) is restored from it, and each other
    command's successful compile kept there."""
    if cache is None:
        return _compile_each(cmds, log_dir)
    actions = [Action.of(cmd) for cmd in cmds]
    hits = [cache.get(a) if a is not None else None for a in actions]
    todo = [i for i, hit in enumerate(hits) if hit is None]
    compiled = dict(zip(todo, _compile_each([cmds[i] for i in todo], log_dir) if todo else [], strict=True))
    for i, proc in compiled.items():
        action = actions[i]
        if action is not None:
            cache.put(action, proc)
    return [hit if hit is not None else compiled[i] for i, hit in enumerate(hits)]


def _compile_each(cmds: list[list[str]], log_dir: Path) -> list[subprocess.CompletedProcess]:
    """run_vela_each's compiles, every command at once."""
    deadline = time.monotonic() + VELA_TIMEOUT_S
    with ExitStack() as stack:
        logs = [(stack.enter_context(tempfile.TemporaryFile("w+", dir=log_dir)),
                 stack.enter_context(tempfile.TemporaryFile("w+", dir=log_dir))) for _ in cmds]
        codes = _fork_all(cmds, logs, deadline) if threading.active_count() == 1 else _spawn_all(cmds, logs, deadline)
        results = []
        for cmd, code, (out, err) in zip(cmds, codes, logs, strict=True):
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(cmd, code, out.read(), err.read()))
    return results


def _run_vela_all(cmds: list[list[str]], accelerator: str, log_dir: Path,
                  cache: VelaCache | None = None) -> list[subprocess.CompletedProcess]:
    """run_vela_each, where any failure fails the stage: the first failing command's last line, as if they had
    run in turn."""
    results = run_vela_each(cmds, log_dir, cache)
    for proc in results:
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            raise StageError(f"Vela failed ({accelerator}): {lines[-1] if lines else 'exit ' + str(proc.returncode)}")
    return results


def _fork_all(cmds: list[list[str]], logs: list[tuple[IO[str], IO[str]]], deadline: float) -> list[int]:
    """Each command's Vela in a forked child at once (_vela_child); their exit codes."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for cmd, (out, err) in zip(cmds, logs, strict=True):
        pid = os.fork()
        if pid == 0:  # the child: never returns into the stage's code, whatever _vela_child raises (a flush of
            code = 1  # its logs onto a full disk did: the child then ran on as a second copy of the stage)
            try:
                code = _vela_child(cmd[3:], out.fileno(), err.fileno())
            finally:
                os._exit(code)
        pids.append(pid)
    return _wait_all(pids, deadline)


def _spawn_all(cmds: list[list[str]], logs: list[tuple[IO[str], IO[str]]], deadline: float) -> list[int]:
    """Each command as its own process at once (an interpreter importing Vela); their exit codes."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
             for cmd, (out, err) in zip(cmds, logs, strict=True)]
    try:
        return [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        raise StageError(f"Vela timed out after {VELA_TIMEOUT_S} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _wait_all(pids: list[int], deadline: float) -> list[int]:
    """Each child's exit code (a signal's as its negative number); past the deadline every child still
    running is killed and the stage fails with one line."""
    codes: dict[int, int] = {}
    try:
        while len(codes) < len(pids):
            for pid in pids:
                if pid in codes:
                    continue
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            if len(codes) < len(pids):
                if time.monotonic() > deadline:
                    raise StageError(f"Vela timed out after {VELA_TIMEOUT_S} s")
                time.sleep(0.01)
    finally:
        for pid in pids:
            if pid not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    return [codes[pid] for pid in pids]


def compile_partition(tosa_src: Path, stem: str, ini: Path, stage_dir: Path, profile: TargetProfile,
                      opts: VelaOptions, cache: VelaCache | None = None) -> dict:
    """Vela on one .tosa: returns its summary, op counts, per-layer CSV path, artifacts, the .tflite and what it
    holds (VelaArtifact), and the raw .npz when the spec asks for Vela's raw output (written from the .tflite).
    `cache`: the build dir's Vela cache, where the lower stage's measured choices may have compiled this very
    graph with this command line (ethosu/vela_cache.py)."""
    with tempfile.TemporaryDirectory(prefix=".vela-", dir=stage_dir) as tmp:
        out_dir = Path(tmp)
        tosa = out_dir / f"{stem}.tosa"  # Vela names its outputs after the input file
        shutil.copyfile(tosa_src, tosa)
        cmd = stage_command(tosa, ini, out_dir / "out", profile, opts)
        (proc,) = _run_vela_all([cmd], profile.accelerator, out_dir, cache)
        # Vela names its output files by their temp path: written as the stage dir's own, so that the log is the
        # same whenever the same graph is compiled (a later stage's key covers every file of this one)
        log = (proc.stdout + proc.stderr).replace(f"{out_dir}/out/", "").replace(str(out_dir), ".")
        write_text(stage_dir / ("vela.log" if stem == "model" else f"{stem}.vela.log"), log)
        produced = sorted((out_dir / "out").iterdir())
        csvs = [p for p in produced if p.name.endswith(".csv") and "_summary_" in p.name]
        if not csvs:
            raise StageError("Vela wrote no summary CSV")
        summary = parse_summary_csv(csvs[0])
        debug_db = out_dir / "out" / f"{stem}_debug.xml"
        moved = parse_layer_bytes(debug_db) if debug_db.is_file() else []
        artifacts = []
        for p in produced:
            if p.name.endswith("_per-layer.csv"):
                os.replace(p, stage_dir / p.name)
                artifacts.append(p.name)
        name = f"{stem}_vela.tflite"
        tflite = stage_dir / name if opts.output_format == "tflite" else stage_dir / "tflite" / name
        tflite.parent.mkdir(exist_ok=True)
        os.replace(out_dir / "out" / name, tflite)
    artifact = VelaArtifact.from_tflite(tflite)
    npz = None
    if opts.output_format == "raw":
        npz = stage_dir / f"{stem}_vela.npz"
        artifact.write_npz(npz)
    artifacts.append((npz or tflite).name)
    npu_ops, cpu_ops = parse_operator_counts(proc.stdout)
    return {"summary": summary, "npu_ops": npu_ops, "cpu_ops": cpu_ops, "artifacts": sorted(artifacts),
            "npz": npz, "tflite": tflite, "artifact": artifact, "per_layer": stage_dir / f"{stem}_per-layer.csv",
            "moved": moved}


def npu_partitions(io: LowerRecord, lower_dir: Path, fam: str) -> list[tuple[int, Path, PartitionRecord]]:
    """(partition index, .tosa path, its record: io and tensor map) for every NPU partition of this family."""
    return [(p.index, lower_dir / p.file, p) for p in io.npu_partitions(fam)]


def compile_model(io_path: Path, profile: TargetProfile, opts: VelaOptions, stage_dir: Path, ini: Path,
                  summary_out: Path, cache: VelaCache | None = None) -> dict:
    """The vela stage's work: every NPU partition of the target's family (io.json) compiled by Vela into
    `stage_dir` with the .ini written from the profile, pools checked, firmware written; summary.json (returned,
    the stage's metrics). A pool that does not fit fails the stage after the summary is written. `cache`: the
    build dir's Vela cache (for_stage_dir), which may hold these very compiles."""
    write_text(ini, render_ini(profile))
    lower_dir = io_path.parent
    io = LowerRecord.read(io_path)
    fam = Accelerator.parse(profile.accelerator).lowering_family
    results, layers, pools, failure = [], [], [], None
    for index, tosa, part in npu_partitions(io, lower_dir, fam):
        stem = vela_stem(index, part.file)
        res = compile_partition(tosa, stem, ini, stage_dir, profile, opts, cache)
        res["index"] = index
        res["sizes"] = res["artifact"].sizes()
        part_pools = pool_usage(profile, res["sizes"])
        pools += [{**p, "partition": index} for p in part_pools]
        failure = failure or pool_failure(profile.name, part_pools)
        if res["per_layer"].is_file():
            part_layers = parse_per_layer(res["per_layer"], part.tensor_nodes or {}, index)
            attach_bytes(part_layers, res["moved"])
            layers += part_layers
        # the firmware of a whole graph is npubuild_model.* whichever family's lowering Vela compiled: its file
        # and symbol names are what a product's firmware includes, and must not change with a lowering form
        fw_stem = "model" if tosa.name == f"{fam}_model.tosa" else stem
        res["firmware"] = write_firmware(stage_dir / "firmware", fw_stem, res["artifact"], part.io, profile, opts)
        results.append(res)
    metrics = combine(profile, results)
    placed = io.families.get(fam)
    metrics.update(placed.placement_metrics() if placed is not None else {})
    metrics.update(roofline(layers, profile, metrics["inference_ms"]))
    rec = io.families.get(fam) or io.portable
    graph = rec.partitions if rec is not None else [io.whole_partition([n.name for n in io.nodes])]
    packaged = package(stage_dir / "firmware", profile, graph, io.inputs, io.outputs, lower_dir,
                       {r["index"]: r["tflite"] for r in results})
    metrics.update({"cortex_m_deployable": packaged.cortex_m_deployable,
                    "tflm_arena_bytes": packaged.tflm_arena_bytes,
                    "deployable": {**packaged.files, "inputs": specs_to_json(packaged.inputs),
                                   "outputs": specs_to_json(packaged.outputs)} if packaged.files else None})
    metrics["deployment"] = write_deployment(stage_dir / "firmware", profile, graph,
                                             {r["index"]: r["firmware"] for r in results}, packaged)
    failure = failure or packaged.failure(profile)
    metrics.update({"pools": pools, "layers": layers, "top_layers": top_layers(layers)})
    write_json(summary_out, metrics)
    if failure:
        raise PoolsTooSmall(failure, {profile.name: pools})
    return metrics


def combine(profile: TargetProfile, results: list[dict]) -> dict:
    """Whole-model figures: partitions run one after another, each with its own arena. With no NPU partition
    (the host runs the whole model) there is no NPU time, cycle, MAC or memory to report: null, never a
    measured 0."""
    def total(key: str) -> float:
        return sum(float(r["summary"][key]) for r in results)

    if not results:
        return {"accelerator": profile.accelerator, "memory_mode": memory_mode_name(profile), "npu_partitions": 0,
                "vela_npu_ops": 0, "vela_cpu_ops": 0, "sram_kib": None, "offchip_kib": None, "inference_ms": None,
                "npu_cycles": None, "macs": None, "memory": None, "artifacts": [], "firmware": [], "summary": {},
                "partition_summaries": []}
    return {
        "accelerator": profile.accelerator,
        "memory_mode": memory_mode_name(profile),
        "npu_partitions": len(results),
        "vela_npu_ops": sum(r["npu_ops"] for r in results),
        "vela_cpu_ops": sum(r["cpu_ops"] for r in results),
        "sram_kib": round(max((float(r["summary"]["sram_memory_used"]) for r in results), default=0.0), 3),
        "offchip_kib": round(total("off_chip_flash_memory_used") + total("dram_memory_used"), 3),
        "inference_ms": round(total("inference_time") * 1000.0, 6),
        "npu_cycles": int(total("cycles_total")),
        "macs": int(total("nn_macs")),
        "memory": {**{k: max((r["sizes"][k] for r in results), default=0) for k in ("arena_bytes", "fast_scratch_bytes")},
                   **{k: sum(r["sizes"][k] for r in results) for k in ("constants_bytes", "command_stream_bytes")}},
        "artifacts": [a for r in results for a in r["artifacts"]],
        "firmware": [r["firmware"] for r in results],
        "summary": dict(results[0]["summary"]) if results else {},
        "partition_summaries": [{"partition": r["index"], **r["summary"]} for r in results[1:]],
    }
