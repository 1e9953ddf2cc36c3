"""What Vela 5.2 models as each Ethos-U's peak rate for work that is not a convolution: the roofline's third limit.

    PYTHONPATH=. .venv/bin/python bench/elementwise_peaks.py [--out bench/elementwise_peaks.md]

A benchmark script, not part of npubuild. The roofline (npubuild/ethosu/perf.py) bounds each layer by its MACs at
the MAC array's peak and its data bytes at each memory's peak. An elementwise op has no MACs, and Vela's
performance model (its debug database, table perf_debug_main) runs it through the datapath at a fixed number of
output elements per cycle (`mac_cycles`), plus per-operation command cycles (`cmd_cycles`). This lowers one
large int8 op of each kind (64x64x64 unless said; Add of two tensors, Mul, a CLAMP, a RESCALE, a 1x1-kernel pool,
a 3x3 depthwise) with npubuild, compiles it for every accelerator with npubuild's own profile and Vela's debug
database, and prints output elements per datapath cycle and the command cycles per op.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from npbtest.ops import calib, quantize_model, rand, single_op_model  # noqa: E402

from npubuild.config.load import default_search_path, load_target  # noqa: E402
from npubuild.ethosu.vela import vela_command  # noqa: E402
from npubuild.ethosu.vela_ini import render_ini  # noqa: E402
from npubuild.lowering.driver import lower_model  # noqa: E402

ACCELERATORS = ["ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512", "ethos-u85-128",
                "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048"]
S = [1, 64, 64, 64]


def models() -> dict[str, tuple]:
    return {
        "add": (single_op_model("Add", {"x": S, "y": S}, {"z": None}), ["x", "y"]),
        "mul": (single_op_model("Mul", {"x": S, "y": S}, {"z": None}), ["x", "y"]),
        "max": (single_op_model("Max", {"x": S, "y": S}, {"z": None}), ["x", "y"]),
        "table (Sigmoid)": (single_op_model("Sigmoid", {"x": S}, {"y": None}), ["x"]),
        "maxpool 3x3/1": (single_op_model("MaxPool", {"x": S}, {"y": None}, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                          ["x"]),
        "depthwise 3x3": (single_op_model("Conv", {"x": S}, {"y": None}, {"w": rand((64, 1, 3, 3), 3)}, group=64,
                                          kernel_shape=[3, 3], pads=[1, 1, 1, 1]), ["x"]),
        "conv 1x1 64->64": (single_op_model("Conv", {"x": S}, {"y": None}, {"w": rand((64, 64, 1, 1), 3)},
                                            kernel_shape=[1, 1]), ["x"]),
    }


def debug_tables(path: Path) -> dict[str, list[dict]]:
    text = path.read_text()
    return {name: list(csv.DictReader(io.StringIO(body)))
            for name, body in re.findall(r'<table name="([^"]+)">\n<!\[CDATA\[\n(.*?)\]\]>', text, re.S)}


def measure(tosa: bytes, accelerator: str) -> list[dict]:
    profile, _ = load_target(accelerator, default_search_path(ROOT), None)
    with tempfile.TemporaryDirectory() as tmp:
        src, ini, out = Path(tmp) / "m.tosa", Path(tmp) / "system.ini", Path(tmp) / "out"
        src.write_bytes(tosa)
        ini.write_text(render_ini(profile))
        cmd = vela_command(src, ini, out, profile, profile.vela) + ["--enable-debug-db"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stdout[-500:] + proc.stderr[-500:])
        t = debug_tables(next(out.glob("*_debug.xml")))
    main = {r["id"]: r for r in t.get("perf_debug_main", [])}
    dbg = {r["id"]: r for r in t.get("perf_debug", [])}
    rows = []
    for r in t["perf"]:
        if float(r["op_cycles"] or 0) <= 0:
            continue
        d, m = dbg.get(r["id"], {}), main.get(r["id"], {})
        ofm = int(np.prod([int(d.get(f"ofm_shape_{a}") or 1) for a in "nhwc"]))
        rows.append({"op": r["operator"], "op_cycles": float(r["op_cycles"]), "macs": float(r["mac_count"] or 0),
                     "mac_cycles": float(m.get("mac_cycles") or 0), "ao_cycles": float(m.get("ao_cycles") or 0),
                     "cmd_cycles": float(m.get("cmd_cycles") or 0), "ofm": ofm})
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    lowered = {}
    for name, (model, inputs) in models().items():
        cal = {k: calib(k, S)[k] for k in inputs}
        lowered[name] = lower_model(quantize_model(model, cal), "int").tosa
    head = "| op | " + " | ".join(ACCELERATORS) + " |"
    lines = ["Per cell: output elements per cycle of Vela's estimate (MACs per cycle for the convolutions) / the same "
             "per datapath cycle (max of `mac_cycles`, `ao_cycles`) / `cmd_cycles`, one int8 op on [1, 64, 64, 64], "
             "npubuild's own profile of each accelerator (Vela 5.2 debug database):", "", head,
             "|---|" + "---:|" * len(ACCELERATORS)]
    for name, tosa in lowered.items():
        cells = []
        for acc in ACCELERATORS:
            rows = measure(tosa, acc)
            main_row = max(rows, key=lambda r: r["op_cycles"])
            work = main_row["macs"] if main_row["macs"] and "conv" in name else main_row["ofm"]
            datapath = max(main_row["mac_cycles"], main_row["ao_cycles"])
            cells.append(f"{work / main_row['op_cycles']:.2f} / {work / datapath if datapath else float('nan'):.2f} / "
                         f"{main_row['cmd_cycles']:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
