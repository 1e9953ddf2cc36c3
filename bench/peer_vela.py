"""Vela as the peer routes run it: the same Vela 5.2 (npubuild's venv), options and system configs as npubuild.

A benchmark helper shared by bench/tflite_route.py and bench/executorch_route.py (each runs in its own scratch
venv, so this module imports nothing beyond the standard library). The peers compile with Vela's bundled
vela.ini and the named system config and memory mode npubuild's target profile mirrors (its `mirrors:`;
tests/ethosu/test_vela_equivalence.py proves npubuild's own .ini models them identically), so the figures are
what a user of that route gets with Vela's own configs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import time
from pathlib import Path

VELA = os.environ.get("VELA", "/work/main/.venv/bin/vela")
BUNDLED_INI = Path(VELA).resolve().parents[1] / "lib" / "python3.11" / "site-packages" / "ethosu" / "config_files" / "Arm" / "vela.ini"

# the named configs npubuild's shipped profiles mirror (targets/base/*.yaml `mirrors:`), by accelerator family
NAMED_CONFIGS = {
    "u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "u65": ("Ethos_U65_High_End", "Dedicated_Sram_384KB"),
    "u85": ("Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB"),
}


def named_config(accelerator: str) -> tuple[str, str]:
    """(system config, memory mode) of Vela's bundled vela.ini for an accelerator ("ethos-u55-128")."""
    return NAMED_CONFIGS[accelerator.split("-")[1]]


def vela_options(stage_record: Path) -> list[str]:
    """The Vela options of the npubuild build whose vela stage record this is, as flags."""
    opts = json.loads(stage_record.read_text())["config"]["vela"] if stage_record.exists() else {}
    flags = ["--optimise", opts.get("optimise", "Performance"),
             "--tensor-allocator", opts.get("tensor_allocator", "HillClimb")]
    if not opts.get("cascading", True):
        flags.append("--disable-cascading")
    return flags + list(opts.get("extra_flags", []))


def ini_section(ini: Path, kind: str) -> str:
    """The name of the .ini's first `[kind.NAME]` section (npubuild's .ini has one of each)."""
    return next(m.group(1) for m in re.finditer(rf"^\[{kind}\.([^\]]+)\]", ini.read_text(), re.MULTILINE))


def vela_stage_dir(entry: dict, build_dir: Path) -> Path:
    """The vela stage directory of one report.json build entry (its .ini and stage record live there)."""
    if "vela" in entry.get("artifacts", {}):
        return Path(entry["artifacts"]["vela"]).parent
    label = f"{entry['model']}-{entry['target']}-"
    found = sorted((build_dir / "stages" / "vela").glob(f"{label}*/system.ini"), key=lambda p: p.stat().st_mtime)
    # the .ini depends only on the target profile: any model's will do when this one's Vela did not run
    found = found or sorted((build_dir / "stages" / "vela").glob(f"*-{entry['target']}-*/system.ini"),
                            key=lambda p: p.stat().st_mtime)
    if not found:
        raise RuntimeError(f"no vela stage for {label} under {build_dir}")
    return found[-1].parent


def vela(network: Path, accelerator: str, options: list[str], out: Path, ini: Path | None = None) -> dict:
    """Compile one network (.tflite or .tosa) with Vela; the figures npubuild reports, plus Vela's seconds.

    ini None: Vela's bundled vela.ini with the named config for the accelerator; else that .ini with its own
    (single) system config and memory mode.
    """
    out.mkdir(parents=True, exist_ok=True)
    if ini is None:
        ini, (system, mode) = BUNDLED_INI, named_config(accelerator)
    else:
        system, mode = ini_section(ini, "System_Config"), ini_section(ini, "Memory_Mode")
    cmd = [VELA, str(network), "--config", str(ini), "--system-config", system, "--memory-mode", mode,
           "--accelerator-config", accelerator, *options, "--output-dir", str(out), "--verbose-performance"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    (out / "vela.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"Vela failed on {network.name}: {proc.stderr.strip().splitlines()[-1:]}")
    summary = next(out.glob(f"{network.stem}_summary_*.csv"))
    with open(summary, newline="") as f:
        row = next(csv.DictReader(f))
    npu = re.search(r"NPU operators\s*=\s*(\d+)", proc.stdout)
    cpu = re.search(r"CPU operators\s*=\s*(\d+)", proc.stdout)
    return {
        "npu_ops": int(npu.group(1)) if npu else 0,
        "cpu_ops": int(cpu.group(1)) if cpu else 0,
        "sram_kib": float(row["sram_memory_used"]),
        "offchip_kib": float(row["off_chip_flash_memory_used"]) + float(row["dram_memory_used"]),
        "inference_ms": float(row["inference_time"]) * 1000.0,
        "npu_cycles": int(float(row["cycles_total"])),
        "vela_s": seconds,
        "system_config": system,
        "memory_mode": mode,
    }


def combine(parts: list[dict]) -> dict:
    """Several NPU partitions run one after another, each with its own arena (as npubuild's vela stage sums)."""
    if len(parts) == 1:
        return parts[0]
    out = {k: sum(p[k] for p in parts) for k in ("npu_ops", "cpu_ops", "offchip_kib", "inference_ms", "npu_cycles",
                                                  "vela_s")}
    out["sram_kib"] = max(p["sram_kib"] for p in parts)
    out["system_config"], out["memory_mode"] = parts[0]["system_config"], parts[0]["memory_mode"]
    return out


def build_named_ms(entry: dict, build_dir: Path, work: Path) -> float | None:
    """Vela's inference ms for one npubuild build's NPU partitions (report.json entry `entry`) through Vela's
    bundled .ini and the named config its target mirrors, with the build's own Vela options: the check that a
    published figure holds under Vela's named configs. None where the build has no TOSA or Vela refuses it."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.ethosu.vela import npu_partitions
    from npubuild.records.lower import LowerRecord

    arts = entry.get("artifacts", {})
    if "tosa" not in arts and "io" not in arts:
        return None
    lower_dir = Path(arts["tosa"] if "tosa" in arts else arts["io"]).parent  # io.json: a graph split around host ops
    acc = entry.get("accelerator") or entry["target"]
    opts = vela_options(vela_stage_dir(entry, build_dir) / "stage.json")
    name = "-".join(str(entry[k]) for k in ("spec", "model", "target") if entry.get(k))
    try:
        parts = [vela(tosa, acc, opts, work / f"{name}-{i}")
                 for i, tosa, _ in npu_partitions(LowerRecord.read(lower_dir / "io.json"), lower_dir,
                                                  Accelerator.parse(acc).lowering_family)]
    except RuntimeError:
        return None
    return combine(parts)["inference_ms"] if parts else None
