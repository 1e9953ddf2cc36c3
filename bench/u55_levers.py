"""Issue 33, U55: Vela's own options at identical TOSA, and where each U55 build's time goes.

    PYTHONPATH=. /work/main/.venv/bin/python bench/u55_levers.py --build-dir BUILD --work /tmp/u55_levers \
        --out bench/u55_levers.md

A benchmark script, not part of npubuild. BUILD is a performance build of configs/ with the ethos-u55-128 target
(bench/routes.py's or bench/size_mode.py's scratch project). For each of the 16 U55 builds bench/routes.md rates
against a peer it
1. recompiles the build's own TOSA partitions with Vela's bundled vela.ini and the named config the U55 profile
   mirrors (Ethos_U55_High_End_Embedded / Shared_Sram, as bench/peer_vela.py runs the peers), the build's own
   options, and one more Vela option per variant: the scheduler features the C++ core lets a user switch off
   (the CLI's --disable-* flags, and FMStaging / Sparsity, which only its [scheduler] disable_feature takes),
   the other tensor allocators, --cpu-tensor-alignment, --optimise Size. The named config's memory figures are
   never changed (--arena-cache-size is one of them);
2. splits the build's Vela per-layer figures into cycles of layers bound by off-chip flash (the layer's flash
   access cycles are its cycles: its weights' bytes at the flash's rate) and the rest, with the largest ops;
3. on the flash-bound autoencoder: permutes the hidden units between its Gemms (the same integers in another
   order: rows of one weight, its bias and per-channel scales, columns of the next) and compiles each order, to
   see whether the order of the weights moves Vela's encoded weight bytes (the layers' flash cycles);
4. writes what the U55 geometric mean of npubuild / best route (bench/routes.md) would need to reach 0.85.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import peer_vela  # noqa: E402

TARGET = "ethos-u55-128"
GOAL = 0.85
# Vela's main with extra names appended to the C++ core's [scheduler] disable_feature (VELA_EXTRA_DISABLE)
WRAPPER = """import os, sys
from ethosu.vela import vela as v
orig = v.get_compiler_config
def patched(*a, **k):
    extra = [x for x in os.environ.get("VELA_EXTRA_DISABLE", "").split(",") if x]
    lines = orig(*a, **k).split("\\n")
    for i, line in enumerate(lines):
        if line.startswith("disable_feature=") and extra:
            lines[i] = "disable_feature=" + "|".join([x for x in line[16:].split("|") if x] + extra)
    return "\\n".join(lines)
v.get_compiler_config = patched
sys.exit(v.main())
"""
VARIANTS: dict[str, tuple[list[str], str]] = {
    "as built": ([], ""),
    "--disable-cascading": (["--disable-cascading"], ""),
    "--disable-buffering": (["--disable-buffering"], ""),
    "--disable-chaining": (["--disable-chaining"], ""),
    "--disable-fwd": (["--disable-fwd"], ""),
    "--disable-ifm-reuse": (["--disable-ifm-reuse"], ""),
    "FMStaging off": ([], "FMStaging"),
    "Sparsity off": ([], "Sparsity"),
    "Greedy allocator": (["--tensor-allocator", "Greedy"], ""),
    "LinearAlloc": (["--tensor-allocator", "LinearAlloc"], ""),
    "--cpu-tensor-alignment 64": (["--cpu-tensor-alignment", "64"], ""),
    "--separate-io-regions (COP2)": (["--cop-format", "COP2", "--separate-io-regions"], ""),
    "--optimise Size": (["--optimise", "Size"], ""),
}


def routes_rows(path: Path) -> dict[str, dict]:
    """bench/routes.md's U55 rows: npubuild's ms, the best route's and their ratio, by model."""
    out = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 4 and cells[1] == TARGET and " / " in cells[2] and cells[3] not in ("-", "best route"):
            ms = [float(v) if v != "-" else None for v in cells[2].split(" / ")]
            out[cells[0]] = {"npubuild": ms[0], "best": min(v for v in ms[1:] if v is not None), "route": cells[3],
                             "ratio": float(cells[4])}
    return out


def flags_for(options: list[str], extra: list[str]) -> list[str]:
    """The build's own options with `extra` replacing any option of the same name."""
    names = {f for f in extra if f.startswith("--")}
    out, skip = [], False
    for i, f in enumerate(options):
        if skip:
            skip = False
            continue
        if f in names:
            skip = i + 1 < len(options) and not options[i + 1].startswith("--")
            continue
        out.append(f)
    return out + extra


def sweep(entry: dict, build_dir: Path, work: Path) -> dict[str, int]:
    from npubuild.ethosu.vela import npu_partitions
    from npubuild.records.lower import LowerRecord

    lower_dir = Path(entry["artifacts"]["tosa"]).parent
    parts = list(npu_partitions(LowerRecord.read(lower_dir / "io.json"), lower_dir, "u55"))
    own = peer_vela.vela_options(peer_vela.vela_stage_dir(entry, build_dir) / "stage.json")
    wrapper = work / "vela_features.py"
    wrapper.write_text(WRAPPER)
    launcher = work / "vela_features"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {wrapper} \"$@\"\n")
    launcher.chmod(0o755)
    cycles = {}
    for name, (extra, disable) in VARIANTS.items():
        os.environ["VELA_EXTRA_DISABLE"] = disable
        peer_vela.VELA = str(launcher) if disable else VELA_BIN
        tag = re.sub(r"[^a-z0-9]+", "_", name.lower())
        rs = [peer_vela.vela(t, TARGET, flags_for(own, extra), work / entry["model"] / tag / str(i))
              for i, t, _ in parts]
        cycles[name] = peer_vela.combine(rs)["npu_cycles"]
        print(entry["model"], name, cycles[name], flush=True)
    return cycles


def limits(entry: dict) -> dict:
    """Cycles of flash-bound layers, the rest, and the largest ops, from the build's own per-layer CSVs."""
    vdir = Path(entry["artifacts"]["vela"]).parent
    total = flash = 0.0
    by_op: collections.Counter = collections.Counter()
    for p in sorted(vdir.glob("*per-layer.csv")):
        for r in csv.DictReader(p.open()):
            c, f = float(r["Op Cycles"]), float(r["OffFlash AC"])
            total += c
            by_op[r["NNG Operator"]] += c
            flash += c if f > 0 and f >= c else 0.0
    return {"total": total, "flash": flash, "top": by_op.most_common(3)}


VELA_BIN = peer_vela.VELA


def _dq_inputs(model, name: str) -> list[str]:
    """The initializer names (values, scale, zero point) of the DequantizeLinear producing `name`."""
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == name)
    return list(node.input)


def permute_hidden(model, order: str, seed: int = 0):
    """A copy of a QDQ Gemm chain (each Gemm's input the previous one's output through Q/DQ only, transB=1) with
    its hidden units reordered: `order` "natural", "l1" (by the producing weight row's L1 norm) or "random"."""
    import numpy as np
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.ModelProto()
    m.CopyFrom(model)
    values = {i.name: nh.to_array(i).copy() for i in m.graph.initializer}
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    rng = np.random.default_rng(seed)
    for a, b in zip(gemms, gemms[1:], strict=False):
        wa, wb = _dq_inputs(m, a.input[1]), _dq_inputs(m, b.input[1])
        w = values[wa[0]]
        if order == "l1":
            perm = np.argsort(np.abs(w.astype(int)).sum(1), kind="stable")
        else:
            perm = rng.permutation(w.shape[0]) if order == "random" else np.arange(w.shape[0])
        for name in [*wa, *_dq_inputs(m, a.input[2])]:
            if values[name].ndim >= 1 and values[name].shape[0] == w.shape[0]:
                values[name] = values[name][perm]
        values[wb[0]] = values[wb[0]][:, perm]
    for init in m.graph.initializer:
        init.CopyFrom(nh.from_array(values[init.name], init.name))
    return m


def weight_orders(entry: dict, work: Path, samples: int = 32) -> list[tuple[str, str, int, float, int, bool]]:
    """(order, TOSA sha256 prefix, NPU cycles, off-chip KiB, Vela's encoded weight bytes, same TOSA reference outputs as the natural order on
    `samples` random int8 inputs) of the model lowered for U55 in each hidden-unit order."""
    import hashlib

    import numpy as np
    import onnx

    from npubuild.lowering.driver import lower_model
    from npubuild.npusim.verify import reference_outputs

    model = onnx.load(entry["artifacts"]["qdq"])
    rng = np.random.default_rng(1)
    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    xs = [rng.integers(-128, 128, dims, dtype=np.int8) for _ in range(samples)]
    want = None
    out = []
    for order in ("natural", "l1", "random"):
        tosa = lower_model(permute_hidden(model, order), "int", "u55").tosa
        got = [reference_outputs(tosa, [x]) for x in xs]
        want = want or got
        same = all(np.array_equal(a, b) for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
        path = work / "orders" / order / "model.tosa"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tosa)
        r = peer_vela.vela(path, TARGET, ["--optimise", "Performance", "--tensor-allocator", "HillClimb"],
                           path.parent / "out")
        with open(next((path.parent / "out").glob("*_summary_*.csv")), newline="") as f:
            encoded = int(float(next(csv.DictReader(f))["total_npu_encoded_weights"]))
        out.append((order, hashlib.sha256(tosa).hexdigest()[:12], r["npu_cycles"], r["offchip_kib"], encoded, same))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--routes", type=Path, default=ROOT / "bench" / "routes.md")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    # the bundled .ini of the Vela this venv runs (peer_vela finds it from the vela script's path)
    rated = routes_rows(args.routes)
    report = json.loads((args.build_dir / "report.json").read_text())
    entries = {e["model"]: e for e in report["builds"] if e["target"] == TARGET and e["model"] in rated
               and "tosa" in e.get("artifacts", {})}
    cache = args.work / "sweep.json"
    swept = json.loads(cache.read_text()) if cache.exists() else {}
    for model, e in entries.items():
        if model not in swept:
            swept[model] = sweep(e, args.build_dir, args.work)
            cache.write_text(json.dumps(swept, indent=1))
    names = list(VARIANTS)
    lines = ["Vela 5.2 on each U55-128 build's own TOSA (this head's build), Vela's bundled vela.ini and named config "
             "Ethos_U55_High_End_Embedded / Shared_Sram, the build's own options plus one per column: NPU cycles "
             "(`=` where equal to the build's). Regenerate: see bench/u55_levers.py.", "",
             "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lower_any = []
    for model, cyc in swept.items():
        base = cyc["as built"]
        cells = [str(base)] + [("=" if cyc[n] == base else f"{cyc[n]} ({100 * (cyc[n] / base - 1):+.1f}%)")
                               for n in names[1:]]
        lower_any += [(model, n) for n in names[1:] if cyc[n] < base]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += ["", "Variants that lower a build's cycles: " + (", ".join(f"{m} {n}" for m, n in lower_any) or "none"),
              "", "## Where each U55 build's time goes (the build's Vela per-layer figures)", "",
              "flash-bound: layers whose off-chip flash access cycles are their cycles (their weights' bytes at the "
              "flash's 1 byte per cycle of the named config); the peers read the same weights.", "",
              "| model | npubuild / best route (ms) | ratio | cycles | flash-bound | rest | largest ops (cycles) |",
              "|---|---|---:|---:|---:|---:|---|"]
    logs = []
    for model in swept:
        r, lim = rated[model], limits(entries[model])
        ratio = r["ratio"]  # routes.md's, of the unrounded figures
        logs.append(math.log(ratio))
        top = ", ".join(f"{op} {c:.0f}" for op, c in lim["top"])
        lines.append(f"| {model} | {r['npubuild']:.4f} / {r['best']:.4f} ({r['route']}) | {ratio:.3f} | "
                     f"{lim['total']:.0f} | {lim['flash']:.0f} ({100 * lim['flash'] / lim['total']:.0f}%) | "
                     f"{lim['total'] - lim['flash']:.0f} | {top} |")
    if "autoencoder" in entries:
        peer_vela.VELA = VELA_BIN
        lines += ["", "The autoencoder's hidden units in three orders (the same integers; npubuild's U55 family lowering, "
                  "named config; outputs: the TOSA reference model's on 32 random int8 inputs against the natural order's):", "",
                  "| order | TOSA sha256 | NPU cycles | off-chip KiB | encoded weight bytes | outputs |",
                  "|---|---|---:|---:|---:|---|"]
        lines += [f"| {o} | {h} | {c} | {k:.3f} | {e} | {'identical' if same else 'DIFFER'} |"
                  for o, h, c, k, e, same in weight_orders(entries["autoencoder"], args.work)]
    n = len(logs)
    gm = math.exp(sum(logs) / n)
    need = math.exp(n * math.log(GOAL) - sum(logs))
    lines += ["", f"U55 geometric mean over these {n} builds: {gm:.3f}. To reach {GOAL}, the product of the {n} ratios "
              f"has to fall by a factor {need:.3f} ({100 * (1 - need):.0f}% off the product): every build "
              f"{100 * (1 - need ** (1 / n)):.1f}% faster, or, with the flash-bound autoencoder fixed at 1.000, "
              f"each of the other {n - 1} {100 * (1 - need ** (1 / (n - 1))):.1f}% faster."]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
