"""16x8 and 8x4 builds of the examples in configs/ beside their 8x8 builds (issue 31).

    python bench/precision_examples.py --work DIR [-n 2] [--only SPEC ...]

Copies configs/ to DIR (a project of its own) and writes, per example spec, `<spec>_16x8.yaml`: the same
models and targets with `quantization: {activations: int16}` and Vela's raw output (so npu-sim checks the
command stream bit for bit against the TOSA reference model), its gates the example's own but the int8
end-to-end LSB bounds (`max_tosa_error_lsb`, `max_deployed_error_lsb`, `max_device_error_lsb`), which would count
16-bit LSBs here (1 LSB8 is 256 LSB16): the SNR against the QDQ model stays, and the per-node bound is 2 LSB of the 16-bit scale (the
interpolating int16 TABLE of a strongly curved function, tanh, exp in the softmax, is 2 LSB off on ~0.1% of inputs;
every other node stays within 1, as the table's node column shows). The
weight-streaming autoencoder also gets `anomaly_detection_8x4.yaml` (`weights: int4`). Builds everything with
`npubuild build` and prints one row per build: time, SRAM and off-chip bytes against the 8x8 build, the TOSA
check (per-node and end-to-end LSB, SNR against the QDQ model), accuracy against float (quant SNR) and npu-sim.
The times come through the .ini npubuild writes for the target profile; the `named` column compiles the build's
and its 8x8 build's NPU partitions again with Vela's bundled vela.ini and the named system config the profile
mirrors (bench/peer_vela.py: Vela 5.2 takes the U55's AXI width from the config's *name*) and says whether both
inference times are the same there (`=`), else gives them.
bench/precision_examples.md keeps a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_vela  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INT4_SPECS = ("anomaly_detection",)


def variants(work: Path, only: list[str]) -> list[str]:
    """Write the 16x8 (and 8x4) variant specs next to the copied examples; returns every spec name built."""
    names = []
    for path in sorted((work / "configs").glob("*.yaml")):
        if path.stem.endswith(("_16x8", "_8x4")) or (only and path.stem not in only):
            continue
        spec = yaml.safe_load(path.read_text())
        names.append(spec["name"])
        q = dict(spec.get("quantization") or {})
        for suffix, change in (("16x8", {"activations": "int16"}), ("8x4", {"weights": "int4"})):
            if suffix == "8x4" and path.stem not in INT4_SPECS:
                continue
            expect = {"max_tosa_error_lsb": None, "max_deployed_error_lsb": None, "max_device_error_lsb": None,
                      "max_tosa_node_error_lsb": 2} if suffix == "16x8" else {}
            variant = {"version": 1, "extends": path.name, "name": f"{spec['name']}_{suffix}",
                       "quantization": {**q, **change}, "vela": {"output_format": "raw"}, "expect": expect}
            (path.parent / f"{path.stem}_{suffix}.yaml").write_text(yaml.safe_dump(variant, sort_keys=False))
            names.append(variant["name"])
    return names


def row(b: dict, base: dict | None) -> str:
    m = b["metrics"]

    def rel(key: str) -> str:
        v, v0 = m.get(key), (base or {}).get("metrics", {}).get(key)
        if v is None:
            return "-"
        return f"{v:.4g}" if not v0 else f"{v:.4g} ({v / v0:.2f}x)"

    def f(key: str, fmt: str = "{:.1f}") -> str:
        v = m.get(key)
        return "-" if v is None else fmt.format(v)

    q = (base or {}).get("metrics", {}).get("quant_snr_db")
    sim = m.get("npusim_bitexact")
    return (f"| {b['spec']} | {b['model']} | {b['target']} | {b['status']} | {rel('inference_ms')} | {rel('sram_kib')} | "
            f"{rel('offchip_kib')} | {f('tosa_node_max_error_lsb', '{:g}')} | {f('tosa_max_error_lsb', '{:g}')} | "
            f"{f('tosa_snr_db')} | {'-' if q is None else f'{q:.1f}'} -> {f('quant_snr_db')} | "
            f"{'-' if sim is None else ('yes' if sim else 'NO')} |")


def named_cell(build_dir: Path, b: dict, base: dict | None, work: Path) -> str:
    """`=` when Vela's bundled named config gives the build (and its 8x8 build) the reported time, else its ms."""
    cells = []
    for entry in (b, base):
        if entry is None or entry["metrics"].get("inference_ms") is None:
            continue
        ms = peer_vela.build_named_ms(entry, build_dir, work)
        if ms is None:
            cells.append("-")
        else:
            cells.append("=" if abs(ms - entry["metrics"]["inference_ms"]) < 5e-6 else f"{ms:.4g}")
    return "/".join(cells) or "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("-n", "--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=[], help="example spec file stems")
    ap.add_argument("--no-build", action="store_true", help="print the table of the last build in --work")
    ap.add_argument("--no-named", action="store_true", help="skip the named-config recompile")
    args = ap.parse_args()
    os.environ.setdefault("VELA", str(Path(sys.executable).parent / "vela"))  # peer_vela: this venv's Vela 5.2
    work = args.work.resolve()
    if not args.no_build:
        if (work / "configs").exists():
            shutil.rmtree(work / "configs")
        shutil.copytree(ROOT / "configs", work / "configs")
        (work / "pyproject.toml").touch()
    names = variants(work, args.only)
    if not args.no_build:
        specs = [str(p) for p in sorted((work / "configs").glob("*.yaml"))
                 if yaml.safe_load(p.read_text())["name"] in names]
        subprocess.run([sys.executable, "-m", "npubuild", "build", *specs, "-n", str(args.jobs), "--keep-going", "-q"],
                       cwd=work, check=False)
    report = json.loads((work / "build" / "report.json").read_text())
    by_id = {(b["spec"], b["model"], b["target"]): b for b in report["builds"]}
    print("| spec | model | target | status | ms (vs 8x8) | SRAM KiB (vs 8x8) | off-chip KiB (vs 8x8) | node LSB | "
          "output LSB | SNR vs QDQ dB | quant SNR vs float dB (8x8 -> this) | npu-sim bit-exact | named config "
          "(this/8x8) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|")
    for (spec, model, target), b in sorted(by_id.items()):
        if not spec.endswith(("_16x8", "_8x4")):
            continue
        base = by_id.get((spec.rsplit("_", 1)[0], model, target))
        named = "-" if args.no_named else named_cell(work / "build", b, base, work / "named")
        print(f"{row(b, base)} {named} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
