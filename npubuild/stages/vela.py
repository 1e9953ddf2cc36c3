"""vela stage: compile the TOSA graph for one target with Vela, parse its summary, check memory fits."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from npubuild.config.schema import TargetProfile, VelaOptions
from npubuild.errors import StageError
from npubuild.fileio import write_json, write_text
from npubuild.plan import StageTask
from npubuild.vela_ini import MEMORY_MODE, SYSTEM_CONFIG, memory_mode_name, render_ini

KIND_USED = {
    "sram": "sram_memory_used",
    "dram": "dram_memory_used",
    "on_chip_flash": "on_chip_flash_memory_used",
    "off_chip_flash": "off_chip_flash_memory_used",
}
VELA_TIMEOUT_S = 1800


def vela_command(tosa: Path, ini: Path, out_dir: Path, profile: TargetProfile, opts: VelaOptions) -> list[str]:
    """The full Vela command line, as a list (never through a shell)."""
    cmd = [sys.executable, "-m", "ethosu.vela", str(tosa),
           "--config", str(ini),
           "--system-config", SYSTEM_CONFIG,
           "--memory-mode", MEMORY_MODE,
           "--accelerator-config", profile.accelerator,
           "--optimise", opts.optimise,
           "--tensor-allocator", opts.tensor_allocator,
           "--output-format", opts.output_format,
           "--output-dir", str(out_dir)]
    if not opts.cascading:
        cmd.append("--disable-cascading")
    cmd.extend(opts.extra_flags)
    return cmd


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


def check_pools(profile: TargetProfile, summary: dict[str, str]) -> list[dict]:
    """Compare Vela's memory use per memory kind with the profile's pool sizes."""
    pools = []
    for name, pool in profile.pools.items():
        used = float(summary.get(KIND_USED[pool.kind], 0.0) or 0.0)
        pools.append({"pool": name, "kind": pool.kind, "used_kib": round(used, 3), "size_kib": pool.size_kib,
                      "fits": used <= pool.size_kib})
    return pools


def run(task: StageTask) -> dict:
    profile = TargetProfile.model_validate(task.config["target"])
    opts = VelaOptions.model_validate(task.config["vela"])
    ini = task.outputs["ini"]
    write_text(ini, render_ini(profile))
    stage_dir = task.dir
    with tempfile.TemporaryDirectory(prefix=".vela-", dir=stage_dir) as tmp:
        out_dir = Path(tmp)
        # Vela names its outputs after the input file: give it a stable name.
        tosa = out_dir / "model.tosa"
        shutil.copyfile(task.inputs["tosa"], tosa)
        cmd = vela_command(tosa, ini, out_dir / "out", profile, opts)
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=VELA_TIMEOUT_S, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise StageError(f"Vela timed out after {VELA_TIMEOUT_S} s") from None
        write_text(stage_dir / "vela.log", proc.stdout + proc.stderr)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            raise StageError(f"Vela failed ({profile.accelerator}): {lines[-1] if lines else 'exit ' + str(proc.returncode)}")
        produced = sorted((out_dir / "out").iterdir())
        csvs = [p for p in produced if p.name.endswith(".csv") and "_summary_" in p.name]
        if not csvs:
            raise StageError("Vela wrote no summary CSV")
        summary = parse_summary_csv(csvs[0])
        artifacts = []
        for p in produced:
            if p.suffix in (".tflite", ".npz"):
                os.replace(p, stage_dir / p.name)
                artifacts.append(p.name)
    npu_ops, cpu_ops = parse_operator_counts(proc.stdout)
    pools = check_pools(profile, summary)
    metrics = {
        "accelerator": profile.accelerator,
        "memory_mode": memory_mode_name(profile),
        "vela_npu_ops": npu_ops,
        "vela_cpu_ops": cpu_ops,
        "sram_kib": round(float(summary["sram_memory_used"]), 3),
        "offchip_kib": round(float(summary["off_chip_flash_memory_used"]) + float(summary["dram_memory_used"]), 3),
        "inference_ms": round(float(summary["inference_time"]) * 1000.0, 6),
        "npu_cycles": int(float(summary["cycles_total"])),
        "macs": int(float(summary["nn_macs"])),
        "pools": pools,
        "artifacts": artifacts,
        "summary": {k: v for k, v in summary.items()},
    }
    write_json(task.outputs["summary"], metrics)
    for pool in pools:
        if not pool["fits"]:
            raise StageError(f"target '{profile.name}': pool '{pool['pool']}' ({pool['kind']}) needs "
                             f"{pool['used_kib']:.1f} KiB but has {pool['size_kib']:.1f} KiB")
    return metrics
