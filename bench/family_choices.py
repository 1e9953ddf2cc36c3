"""Re-measure npubuild's family-specific lowering forms (npubuild/lowering/options.py) with Vela.

A benchmark script, not a test: it prints markdown tables. Run it from the project root, after building
the examples once (the QDQ models are the quantize stage's, read from that build dir; a missing one is
made there by running the import and quantize stages):

    python -m npubuild build configs --build-dir /tmp/b -n 2
    PYTHONPATH=. python bench/family_choices.py --build-dir /tmp/b -j 2           # family u55, U55-32..256
    PYTHONPATH=. python bench/family_choices.py --build-dir /tmp/b --family u65 \\
        --targets ethos-u65-256 ethos-u65-512
    PYTHONPATH=. python bench/family_choices.py --sweep -j 2                      # the threshold predicates

Default mode: every example model in configs/ is lowered as the lower stage lowers it (pipeline passes,
then lower_model with the family's LoweringOptions) as they stand, then with each choice flipped for that
family alone and with each threshold knob moved (`variants`), and compiled by Vela through
npubuild's own .ini and options (vela_command, render_ini, the target profile and the spec's Vela
options) for every target. Per variant: cycles, inference ms, SRAM and off-chip KiB, before -> after,
for every (model, target) whose TOSA the variant changes. bench/family_choices.md keeps the results.

--sweep: micro-graphs over a grid of shapes, each predicate's two (or more) forms forced; per shape and
target the change against the first form and which form wins (SWEEPS). About 3.5 minutes with -j 2.
"""

from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from npubuild.config.load import default_search_path, load_specs, load_target, vela_options
from npubuild.engine.execute import run_stage
from npubuild.engine.plan import make_plan
from npubuild.ethosu.vela import vela_command
from npubuild.ethosu.vela_ini import render_ini
from npubuild.frontend.normalise import normalise
from npubuild.frontend.passes import run_passes
from npubuild.frontend.qdq_concat import share_concat_scales
from npubuild.frontend.quantize import quantize
from npubuild.lowering.driver import lower_model
from npubuild.lowering.ops import conv as ops_conv
from npubuild.lowering.options import FAMILY_OPTIONS, ConcatCopy, DepthwiseLimits, PlaneSumLimits
from npubuild.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256"]
BIG = 1 << 30
Changes = dict[str, object]  # LoweringOptions fields to set; "unshared" replaces ops_conv.unshared
CHOICES = ("concat_order", "dw_requantize", "concat_copy", "bilinear_channel_split",
           "plane_sum", "plane_rows", "norm_widen_add", "norm_index_rescale", "conv_stride_taps", "softmax_wide",
           "row_stats_channels", "norm_raw_squares", "norm_affine_one_row", "transpose_conv_phases")


def dw_limits(channels: int, plane: int = 0) -> Changes:
    """The 1x1 depthwise form (LoweringOptions.depthwise_pays) up to `channels`, from a `plane` of H*W."""
    return {"depthwise_limits": DepthwiseLimits(channels, plane)}


def sum_limits(count: int, channels: tuple[int, int] = (0, BIG)) -> Changes:
    """REDUCE_SUM for a whole-plane mean (LoweringOptions.plane_sum_pays) from `count` elements, in `channels`."""
    return {"plane_sum": PlaneSumLimits(count, *channels)}


def lower(model: onnx.ModelProto, fam: str, changes: Changes) -> bytes:
    """The family's lowering with `changes` to its options (and, for "unshared", to ops_conv)."""
    changes = dict(changes)
    unshared = changes.pop("unshared", None)
    saved = ops_conv.unshared
    if unshared is not None:
        ops_conv.unshared = unshared  # a form with no option (always on): replaced in this process only
    try:
        return lower_model(copy.deepcopy(model), "int", options=replace(FAMILY_OPTIONS[fam], **changes)).tosa
    finally:
        ops_conv.unshared = saved


# ------------------------------------------------------------------------------------------------ Vela

class Vela:
    """Vela runs through npubuild's .ini and options, cached by (TOSA bytes, target), run on `jobs` threads."""

    def __init__(self, jobs: int) -> None:
        self.pool = ThreadPoolExecutor(jobs)
        self.cache: dict[tuple[str, str, str], object] = {}
        self.search = default_search_path(ROOT)

    def submit(self, tosa: bytes, target: str, spec_vela=None):
        key = (hashlib.sha256(tosa).hexdigest(), target, repr(spec_vela))
        if key not in self.cache:
            self.cache[key] = self.pool.submit(self._run, tosa, target, spec_vela)
        return self.cache[key]

    def _run(self, tosa: bytes, target: str, spec_vela) -> dict[str, float]:
        profile, _ = load_target(target, self.search, None)
        with tempfile.TemporaryDirectory(prefix="bench-vela-") as tmp:
            src, ini, out = Path(tmp) / "m.tosa", Path(tmp) / "system.ini", Path(tmp) / "out"
            src.write_bytes(tosa)
            ini.write_text(render_ini(profile))
            cmd = vela_command(src, ini, out, profile, vela_options(profile.vela, spec_vela))
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if proc.returncode != 0:
                return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1]}
            with next(out.glob("*_summary_*.csv")).open(newline="") as f:
                s = next(csv.DictReader(f))
        return {"cycles": float(s["cycles_total"]), "ms": float(s["inference_time"]) * 1000.0,
                "sram": float(s["sram_memory_used"]),
                "offchip": float(s["off_chip_flash_memory_used"]) + float(s["dram_memory_used"])}


def cell(a: dict, b: dict, key: str, fmt: str) -> str:
    if "error" in a or "error" in b:
        return "error: " + (a.get("error") or b.get("error"))
    if a[key] == b[key]:
        return format(a[key], fmt)
    pct = f" ({100.0 * (b[key] / a[key] - 1):+.1f}%)" if a[key] else ""
    return f"{a[key]:{fmt}} -> {b[key]:{fmt}}{pct}"


# ---------------------------------------------------------------------------------------- example models

def flip(choice: str, fam: str) -> Changes:
    """The choice turned off for `fam` if it takes it, else on (plane_sum / plane_rows on with U55's limits)."""
    value = getattr(FAMILY_OPTIONS[fam], choice)
    if choice in ("plane_sum", "plane_rows"):
        return {choice: None if value is not None else getattr(FAMILY_OPTIONS["u55"], choice)}
    if choice == "concat_copy":  # off: Vela's own copy; on: the family's, else U55's depthwise one
        return {choice: ConcatCopy.VELA if value != ConcatCopy.VELA else FAMILY_OPTIONS["u55"].concat_copy}
    return {choice: not value}


def variants(fam: str) -> dict[str, Changes]:
    """Each choice flipped for `fam`, then the threshold knobs moved (the names say to what)."""
    opts = FAMILY_OPTIONS[fam]
    out = {f"{c} ({'off' if getattr(opts, c) not in (False, None, ConcatCopy.VELA) else 'on'})": flip(c, fam)
           for c in CHOICES}
    if opts.concat_copy == ConcatCopy.DEPTHWISE:  # the depthwise copy comes first
        out["concat_copy MAXIMUM instead of DEPTHWISE"] = {"concat_copy": ConcatCopy.MAXIMUM}
    lim = opts.depthwise_limits
    for most in (8, 16, 32, BIG):
        if most != lim.max_channels:
            out[f"depthwise form up to {most if most < BIG else 'any'} channels"] = dw_limits(most, lim.min_plane)
    for least in (0, 256, 1024):
        if least != lim.min_plane:
            out[f"depthwise form from a plane of {least}"] = dw_limits(lim.max_channels, least)
    out.update({
        "bilinear row pad per half": {"shared_row_pad": False},
        "split_min_bytes=0": {"split_min_bytes": 0},
        "split_min_bytes=80K": {"split_min_bytes": 80 * 1024},
        "plane_sum from any window": sum_limits(0),
        f"planar input {'off' if opts.planar_input_channels is not None else 'on'}":
            {"planar_input_channels": None if opts.planar_input_channels is not None else 4},
        "fully-connected unshared SLICE off": {"unshared": lambda ctx, x: x},
    })
    return out


def qdq_models(build_dir: Path) -> list[tuple[str, onnx.ModelProto, object]]:
    """(model name, its QDQ model after the pipeline's passes, the spec's Vela options) per example model."""
    builds = load_specs([ROOT / "configs"])
    plan = make_plan(builds, build_dir, STAGES)
    seen, out = set(), []
    for b in builds:
        if b.model_name in seen or b.pipeline.profile != "int":
            continue
        seen.add(b.model_name)
        chain = plan.build_tasks[b.id]
        quant = plan.tasks[chain["quantize"]]
        if not quant.outputs["onnx"].is_file():  # not built yet: the import and quantize stages, as a build runs them
            for stage in ("import", "quantize"):
                task = plan.tasks[chain[stage]]
                if not task.outputs[("onnx")].is_file():
                    run_stage(task, "bench-family-choices")
        model = onnx.load(str(quant.outputs["onnx"]))
        model = ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(model), b.pipeline.passes))
        out.append((b.model_name, model, b.spec.vela))
    return out


def bench_models(args: argparse.Namespace) -> None:
    vela = Vela(args.jobs)
    models = [m for m in qdq_models(Path(args.build_dir)) if not args.models or m[0] in args.models]
    todo = {k: v for k, v in variants(args.family).items() if not args.only or any(o in k for o in args.only)}
    base: dict[str, bytes] = {}
    lowered: dict[tuple[str, str], bytes] = {}
    for name, model, spec_vela in models:
        base[name] = lower(model, args.family, {})
        for t in args.targets:
            vela.submit(base[name], t, spec_vela)
        for v, changes in todo.items():
            tosa = lower(model, args.family, changes)
            if tosa != base[name]:
                lowered[(v, name)] = tosa
                for t in args.targets:
                    vela.submit(tosa, t, spec_vela)
    spec_of = {name: sv for name, _, sv in models}

    def res(tosa: bytes, name: str, t: str) -> dict:
        return vela.submit(tosa, t, spec_of[name]).result()

    print(f"# family {args.family}: the table as it stands\n")
    print("| model | " + " | ".join(args.targets) + " |\n|---|" + "---|" * len(args.targets))
    for name in base:
        cells = [res(base[name], name, t) for t in args.targets]
        print(f"| {name} | " + " | ".join(f"{c['cycles']:.0f} cyc, {c['ms']:.4f} ms, {c['sram']:.1f} / "
                                            f"{c['offchip']:.2f} KiB" if "error" not in c else c["error"]
                                            for c in cells) + " |")
    print(f"\n# each variant against it (family {args.family})\n")
    for v in todo:
        names = [n for n in base if (v, n) in lowered]
        print(f"## {v}\n")
        if not names:
            print("no example model's TOSA changes\n")
            continue
        print("| model | target | cycles | inference ms | SRAM KiB | off-chip KiB |\n|---|---|---|---|---|---|")
        for name in names:
            for t in args.targets:
                a, b = res(base[name], name, t), res(lowered[(v, name)], name, t)
                print(f"| {name} | {t} | {cell(a, b, 'cycles', '.0f')} | {cell(a, b, 'ms', '.4f')} | "
                      f"{cell(a, b, 'sram', '.2f')} | {cell(a, b, 'offchip', '.3f')} |")
        same = [n for n in base if n not in names]
        print(f"\nsame TOSA: {', '.join(same) if same else 'none'}\n")


# ------------------------------------------------------------------------------------------- micro-graphs

def _model(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int]], inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs.items()],
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in outputs.items()], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return normalise(m, {}, "<bench>")


def _qdq(model: onnx.ModelProto, ranges: dict[str, tuple[float, float]], share: bool = True) -> onnx.ModelProto:
    """onnxruntime QDQ int8 as the quantize stage does it (with `share`: Concat groups sharing one scale)."""
    rng = np.random.default_rng(0)
    arrays = {i.name: rng.uniform(*ranges[i.name], (8, *[d.dim_value for d in i.type.tensor_type.shape.dim]))
              .astype(np.float32) for i in model.graph.input}
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "f.onnx")
        qdq = quantize(Path(tmp) / "f.onnx", arrays, {"per_channel": True, "method": "minmax",
                                                       "symmetric_activations": False})
    if share:
        share_concat_scales(qdq)
    return qdq


def _w(rng, name: str, shape) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def requant_concat(c: int, hw: int) -> onnx.ModelProto:
    """Concat of two inputs at different ranges, scales not shared: `a` is requantised to the output's."""
    s = [1, c, hw, hw]
    m = _model([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], {"a": s, "b": s}, {"y": [1, 2 * c, hw, hw]})
    return _qdq(m, {"a": (-1.0, 1.0), "b": (-2.5, 3.5)}, share=False)


def copied_concat(c: int, hw: int) -> onnx.ModelProto:
    """A conv's output read by a MaxPool and a Concat (a U-Net skip): Vela copies it into the Concat."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]), helper.make_node("Relu", ["c1"], ["skip"]),
             helper.make_node("Conv", ["x", "w2"], ["c2"]),
             helper.make_node("Concat", ["c2", "skip"], ["y"], axis=1),
             helper.make_node("MaxPool", ["skip"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    m = _model(nodes, {"x": [1, 4, hw, hw]}, {"y": [1, 2 * c, hw, hw], "p": [1, c, hw // 2, hw // 2]},
               [_w(rng, "w1", (c, 4, 1, 1)), _w(rng, "w2", (c, 4, 1, 1))])
    return _qdq(m, {"x": (-1.0, 1.0)})


def plane_mean(c: int, k: int) -> onnx.ModelProto:
    """1x1 MaxPool -> AveragePool over the whole k x k plane -> 1x1 MaxPool: onnxruntime keeps the scale."""
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("AveragePool", ["a"], ["b"], kernel_shape=[k, k]),
             helper.make_node("MaxPool", ["b"], ["y"], kernel_shape=[1, 1])]
    return _qdq(_model(nodes, {"x": [1, c, k, k]}, {"y": [1, c, 1, 1]}), {"x": (-1.0, 3.0)})


def unet_step(size: int, deep: int, skip: int = 8) -> onnx.ModelProto:
    """x -> conv+relu (skip) -> maxpool -> conv+relu (deep) -> bilinear 2x -> concat(up, skip) -> conv."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["skip"]),
             helper.make_node("MaxPool", ["skip"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["pool", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["deep"]),
             helper.make_node("Resize", ["deep", "", "scales"], ["up"], mode="linear",
                              coordinate_transformation_mode="half_pixel"),
             helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1), helper.make_node("Conv", ["cat", "w3"], ["y"])]
    inits = [_w(rng, "w1", (skip, 2, 3, 3)), _w(rng, "w2", (deep, skip, 3, 3)), _w(rng, "w3", (4, skip + deep, 1, 1)),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    return _qdq(_model(nodes, {"x": [1, 2, size, size]}, {"y": [1, 4, size, size]}, inits), {"x": (-1.0, 1.0)})


NO_SKIP_COPY: Changes = {"concat_copy": ConcatCopy.VELA}


def _upsample_forms(fam: str, shape: tuple[int, int]) -> dict[str, Changes]:
    split = {"split_min_bytes": 0}
    whole = {"bilinear_channel_split": False}
    return {"whole, pad by copy": {**NO_SKIP_COPY, **whole, **dw_limits(0)},
            "whole, pad by dw": {**NO_SKIP_COPY, **whole, **dw_limits(BIG)},
            "halves, pads by copy": {**NO_SKIP_COPY, **split, **dw_limits(0)},
            "halves, per-half pads by dw": {**NO_SKIP_COPY, **split, "shared_row_pad": False, **dw_limits(BIG)},
            "halves, shared row pad by dw": {**NO_SKIP_COPY, **split, **dw_limits(BIG)},
            "rule": NO_SKIP_COPY}


# name: (shape grid, model maker, forms (first: the reference), what the shape means)
SWEEPS: dict[str, tuple[list, Callable, Callable[[str, tuple], dict[str, Changes]], str]] = {
    "dw_requantize (Concat of a requantised input)": (
        [(c, hw) for c in (8, 16, 32, 64, 128) for hw in (4, 8, 16, 32, 64)], requant_concat,
        lambda f, s: {"RESCALE": dw_limits(0), "1x1 depthwise": dw_limits(BIG), "rule": {}}, "channels, plane HxW"),
    "concat_copy DEPTHWISE (a Concat input read twice)": (
        [(c, hw) for c in (8, 16, 32, 64, 128) for hw in (4, 8, 16, 32, 64)], copied_concat,
        lambda f, s: {"MemoryCopy": dw_limits(0), "1x1 depthwise": dw_limits(BIG), "rule": {}},
        "channels, plane HxW"),
    "plane_sum (whole-plane mean at the same scale)": (
        [(c, k) for c in (8, 16, 32, 64, 96, 128, 256) for k in (2, 3, 4, 5, 8, 16)], plane_mean,
        lambda f, s: {"AVG_POOL2D": sum_limits(BIG), "REDUCE_SUM": sum_limits(0), "rule": {}},
        "channels, window KxK"),
    "bilinear 2x on U55: split and edge-pad copies (U-Net step, skip 8 channels)": (
        [(hw, c) for hw in (8, 16, 32) for c in (16, 32, 64)], lambda hw, c: unet_step(2 * hw, c),
        _upsample_forms, "upsample input HxW, channels"),
}


def sweep_cells(names: list[str], r: dict[str, dict]) -> list[str]:
    """One table row's cells: each form's cycles (and change against the first), SRAM where they differ."""
    ok = [f for f in names if "error" not in r[f]]
    best = min(ok, key=lambda f: (r[f]["cycles"], r[f]["sram"])) if ok else None
    srams, ref, cells = {r[f]["sram"] for f in ok}, r[names[0]], []
    for f in names:
        if "error" in r[f]:
            cells.append("error")
            continue
        txt = f"{r[f]['cycles']:.0f}"
        if f != names[0] and "error" not in ref:
            txt += f" ({100 * (r[f]['cycles'] / ref['cycles'] - 1):+.1f}%)"
        txt += f", {r[f]['sram']:.1f} KiB" if len(srams) > 1 else ""
        cells.append(f"**{txt}**" if f == best else txt)
    return cells


def bench_sweep(args: argparse.Namespace) -> None:
    vela = Vela(args.jobs)
    fam = args.family
    for title, (grid, make, forms_of, what) in SWEEPS.items():
        if args.only and not any(o in title for o in args.only):
            continue
        rows = []
        for shape in grid:
            qdq = make(*shape)
            forms = {}
            for form, changes in forms_of(fam, shape).items():
                forms[form] = lower(qdq, fam, changes)
            rows.append((shape, forms, {(f, t): vela.submit(tosa, t) for f, tosa in forms.items() for t in args.targets}))
        names = [f for f in forms_of(fam, grid[0]) if f != "rule"]
        print(f"## {title}\n\nper target: cycles of each form against `{names[0]}` (SRAM KiB where they differ); "
              "the winner in bold, `rule`: the form the lowering picks now\n")
        print(f"| {what} | target | " + " | ".join(names) + " | rule |\n|---|---|" + "---|" * (len(names) + 1))
        for shape, forms, fut in rows:
            rule = next((f for f in names if forms[f] == forms["rule"]), "other")
            for t in args.targets:
                cells = sweep_cells(names, {f: fut[(f, t)].result() for f in forms})
                print(f"| {' x '.join(map(str, shape))} | {t} | " + " | ".join(cells) + f" | {rule} |")
        print()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", help="a build dir of `npubuild build configs` (its QDQ models)")
    p.add_argument("--family", default="u55")
    p.add_argument("--targets", nargs="+", default=TARGETS)
    p.add_argument("--models", nargs="+", help="only these example models")
    p.add_argument("--only", nargs="+", help="only variants / sweeps whose name contains one of these")
    p.add_argument("--sweep", action="store_true", help="the threshold sweeps on micro-graphs instead")
    p.add_argument("-j", "--jobs", type=int, default=1, help="Vela runs at a time")
    args = p.parse_args(argv)
    if args.sweep:
        bench_sweep(args)
    elif args.build_dir:
        bench_models(args)
    else:
        p.error("--build-dir is needed (or --sweep)")


if __name__ == "__main__":
    sys.exit(main())
