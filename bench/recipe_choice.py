"""The quantize stage's `auto` recipe choice: every candidate built, scored several ways, checked on held-back data.

    python bench/recipe_choice.py measure SPEC ... --heldout DIR --work DIR [--only NAME ...]
    python bench/recipe_choice.py table --work DIR [--out FILE.md] [--command TEXT]

`measure` imports each spec's model (as bench/ptq_speed.py does), takes the calibration rows the stage takes
(frontend/quantize.py) and builds the full grid of recipes ptq/choose.py picks from (4 range estimators x
equalisation x bias correction) with the stage's own candidate builder. Each candidate is run beside its float
model on the first 16 calibration rows (what the choice sees): per probe tensor and per row, the float signal
and the error energy; probes are the graph's float outputs, the input of a saturating activation
(Sigmoid/Softmax/HardSigmoid/Tanh) that makes a graph output, and every quantised activation (an equalised
candidate's activations against the equalised float model's). Then on the held-back inputs (bench/real_heldout.py;
never seen by the build) against the float model: per output, the pooled SNR bench/real_routes.py reports (the
worst output's is the model's figure). DIR/<model>.json keeps the raw sums.

`table` replays ptq/choose.py's greedy search (estimators; bias correction on the best; equalisation with the
best estimator) under each scoring rule in RULES and prints, per model, the recipe each rule picks and its
held-back SNR, with geomean / mean / worst over models.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

SATURATING = ("Sigmoid", "Softmax", "HardSigmoid", "Tanh")
ROWS = 16  # ptq/choose.py's MAX_SCORE_SAMPLES: the rows a rule scores on unless it says otherwise
MEASURED_ROWS = 64  # calibration rows measured (a rule may score on more than ROWS)
CAP = 200.0


# ----------------------------------------------------------------------------------------------- measure


def _producer(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _saturating_input(model: onnx.ModelProto, output: str) -> str | None:
    """The input of the saturating activation that makes `output`, through any Q/DQ pair after it."""
    prod = _producer(model)
    node = prod.get(output)
    while node is not None and node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        node = prod.get(node.input[0])
    return node.input[0] if node is not None and node.op_type in SATURATING else None


def _activations(qdq: onnx.ModelProto, float_names: set[str]) -> dict[str, str]:
    """float activation -> the QDQ model's dequantised copy of it (weights and graph inputs left out)."""
    inits = {t.name for t in qdq.graph.initializer}
    dq_of = {n.input[0]: n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    out = {}
    for n in qdq.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in float_names and n.input[0] not in inits \
                and n.output[0] in dq_of:
            out[n.input[0]] = dq_of[n.output[0]]
    return out


def _exposing(model: onnx.ModelProto, names: list[str]):
    import onnxruntime as ort

    from npubuild.frontend.ptq.session import session_options

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in names:
        if name not in have:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
            have.add(name)
    return ort.InferenceSession(m.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


def _grid(build_, model: onnx.ModelProto, float_model: onnx.ModelProto, arrays: dict, q: dict) -> list[dict]:
    """Every candidate ptq/choose.py can reach, each with the float model it is quantised from."""
    from npubuild.frontend.ptq import ranges
    from npubuild.frontend.ptq.bias_correction import correct_biases
    from npubuild.frontend.ptq.choose import AUTO_ESTIMATORS
    from npubuild.frontend.ptq.equalize import equalise
    from npubuild.frontend.ptq.stats import collect

    fixed = ranges.fixed_ranges(model)
    equalised, pairs = equalise(model, arrays)
    out = []
    for eq, m in ((False, model), (True, equalised)) if pairs else ((False, model),):
        stats = collect(m, arrays, histograms=True)
        for est in AUTO_ESTIMATORS:
            settings = dict(q, method=est)
            settings["_ranges"] = ranges.overrides(stats, est, q["symmetric_activations"], fixed)
            qdq = build_(settings, m)
            corrected = onnx.ModelProto()
            corrected.CopyFrom(qdq)
            count = correct_biases(corrected, m, arrays)
            out.append({"method": est, "eq": eq, "bc": False, "model": qdq, "float": m, "corrected": 0})
            out.append({"method": est, "eq": eq, "bc": True, "model": corrected, "float": m, "corrected": count})
    return out


def _energies(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64).reshape(np.shape(ref))
    return float((ref ** 2).sum()), float(((ref - got) ** 2).sum())


def measure_one(build, heldout: list[Path]) -> dict:
    from npubuild.frontend.data import calibration_arrays
    from npubuild.frontend.normalise import import_model
    from npubuild.frontend.ort_quantiser import QuantiserCache
    from npubuild.frontend.quantize import candidate_builder, resolve_auto
    from npubuild.frontend.samples import SampleSource

    with tempfile.TemporaryDirectory(prefix="recipe-choice-") as tmp:
        imported = Path(tmp) / "model.onnx"
        import_model(build.model_path, dict(build.model.input_shapes), imported)
        model = onnx.load(str(imported))
        calibration = build.model.calibration.model_dump()
        arrays = calibration_arrays(model, calibration, build.calibration_npy)
        source = SampleSource.of(build)
        if source.kind == "held-back":
            arrays = source.calibration_rows(arrays)
        q = resolve_auto(build.spec.quantization.model_dump(), calibration)
        builder = candidate_builder(imported, model, arrays, QuantiserCache(Path(tmp) / "cache"),
                                    dict(build.model.feedback.items()))
        grid = _grid(builder, model, model, arrays, q)

    float_out = [o.name for o in model.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    float_names = {o for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    n_cal = min(MEASURED_ROWS, next(iter(arrays.values())).shape[0])
    cal_feeds = [{k: np.asarray(v[i]) for k, v in arrays.items() if k in inputs} for i in range(n_cal)]

    # probes: (kind, float tensor); per candidate the QDQ tensor each maps to
    probes: list[tuple[str, str]] = [("output", o) for o in float_out]
    pre_of = {o: s for o in float_out if (s := _saturating_input(model, o))}
    probes += [("preact", s) for s in dict.fromkeys(pre_of.values())]
    acts = [_activations(c["model"], float_names) for c in grid]
    common = sorted(set.intersection(*(set(a) for a in acts))) if acts else []
    probes += [("internal", t) for t in common]

    def qdq_name(ci: int, kind: str, name: str) -> str:
        if kind == "output":
            return name
        if kind == "preact":
            for o in float_out:
                if _saturating_input(model, o) == name:
                    return _saturating_input(grid[ci]["model"], o)
        return acts[ci][name]

    floats = {id(c["float"]): c["float"] for c in grid}
    fsess = {k: _exposing(m, [p[1] for p in probes[len(float_out):]]) for k, m in floats.items()}
    qnames = [[qdq_name(ci, k, t) for k, t in probes] for ci in range(len(grid))]
    qsess = [_exposing(c["model"], qn) for c, qn in zip(grid, qnames, strict=True)]
    # the outputs from sessions of the models as they are (as ptq/choose.py runs them: a tensor exposed as an
    # output stops onnxruntime fusing through it, which moves float results by an ulp or so)
    psess = [_exposing(c["model"], []) for c in grid]
    plain = _exposing(model, [])
    sig = np.zeros((len(floats), len(probes), n_cal))
    noise = np.zeros((len(grid), len(probes), n_cal))
    fkeys = list(floats)
    n_out = len(float_out)
    for i, fd in enumerate(cal_feeds):
        ref = {k: fsess[k].run([p[1] for p in probes[n_out:]], fd) for k in fkeys}
        ref_out = plain.run(float_out, fd)
        for ci, c in enumerate(grid):
            got = psess[ci].run(float_out, fd) + qsess[ci].run(qnames[ci][n_out:], fd)
            r = ref_out + ref[id(c["float"])]  # an equalised model's outputs are the plain float model's
            for pi in range(len(probes)):
                s, e = _energies(r[pi], got[pi])
                sig[fkeys.index(id(c["float"])), pi, i] = s
                noise[ci, pi, i] = e
    held_out = {}
    for h in heldout:  # every candidate against the plain float model, outputs only
        held = dict(np.load(h / f"{build.spec.name}.npz"))
        feeds = [{k: np.asarray(v[i], cal_feeds[0][k].dtype).reshape(cal_feeds[0][k].shape)
                  for k, v in held.items() if k in inputs} for i in range(next(iter(held.values())).shape[0])]
        hsig = np.zeros((len(float_out), len(feeds)))
        hnoise = np.zeros((len(grid), len(float_out), len(feeds)))
        for i, fd in enumerate(feeds):
            ref = plain.run(float_out, fd)
            for ci in range(len(grid)):
                got = psess[ci].run(float_out, fd)
                for oi in range(len(float_out)):
                    s, e = _energies(ref[oi], got[oi])
                    hsig[oi, i] = s
                    hnoise[ci, oi, i] = e
        held_out[h.name] = {"sig": hsig.tolist(), "noise": hnoise.tolist()}
    return {"model": build.spec.name, "probes": probes, "outputs": float_out, "pre_of": pre_of,
            "candidates": [{"method": c["method"], "eq": c["eq"], "bc": c["bc"], "corrected": c["corrected"],
                            "float": fkeys.index(id(c["float"]))} for c in grid],
            "sig": sig.tolist(), "noise": noise.tolist(), "held": held_out}


def measure(args: argparse.Namespace) -> None:
    from npubuild.config.load import collect_spec_files, load_spec

    args.work.mkdir(parents=True, exist_ok=True)
    for spec in collect_spec_files(args.specs):
        for build in load_spec(spec):
            if (args.only and build.spec.name not in args.only) or build.pipeline.profile != "int":
                continue
            out = args.work / f"{build.spec.name}.json"
            if out.exists():
                continue
            r = measure_one(build, args.heldout)
            out.write_text(json.dumps(r))
            print(build.spec.name, len(r["candidates"]), "candidates", len(r["probes"]), "probes", flush=True)
            break


# ----------------------------------------------------------------------------------------------- rules


def _db(s: float, n: float) -> float:
    return CAP if n == 0 else float(min(CAP, 10 * math.log10(max(s, 1e-30) / n)))


def per_row(s: np.ndarray, n: np.ndarray) -> float:
    """ptq/choose.py's output SNR today: the mean over rows of each row's own."""
    return float(np.mean([_db(a, b) for a, b in zip(s, n, strict=True)]))


def pooled(s: np.ndarray, n: np.ndarray) -> float:
    """One SNR over all rows: each row weighs by its signal (a silent row adds nothing)."""
    return _db(float(np.sum(s)), float(np.sum(n)))


def weighted(s: np.ndarray, n: np.ndarray, quiet: float = 1.0) -> float:
    """The mean over rows of each row's own SNR, a row weighed by its signal against `quiet` x the rows' mean
    signal, at most 1: a near-silent row (its float output ~0, its SNR set by error at the ulp level) counts
    for next to nothing, no row of outsized values counts more than a typical one, and with `quiet` small every
    row of real signal counts fully (today's mean). All rows silent: today's per-row mean."""
    m = float(np.mean(s)) * quiet
    if m <= 0:
        return per_row(s, n)
    w = np.minimum(1.0, np.asarray(s, np.float64) / m)
    return float(np.sum(w * [_db(a, b) for a, b in zip(s, n, strict=True)]) / np.sum(w))


def quiet(q: float):
    return lambda s, n: weighted(s, n, q)


def _output_scores(d: dict, ci: int, agg, kinds: str, rows: int = ROWS) -> list[float]:
    """One SNR per scored output. kinds: 'out' the outputs; 'pre' a saturating output's input instead of it;
    'both' each output, and beside it its saturating input."""
    sig, noise = np.asarray(d["sig"]), np.asarray(d["noise"])
    f = d["candidates"][ci]["float"]
    idx = {(k, t): i for i, (k, t) in enumerate(d["probes"])}
    pre_of = d.get("pre_of", {})
    scores = []
    for o in d["outputs"]:
        i = idx[("output", o)]
        p = idx.get(("preact", pre_of.get(o))) if o in pre_of else None
        use = [i] if kinds == "out" or p is None else ([p] if kinds == "pre" else [i, p])
        scores += [agg(sig[f, j, :rows], noise[ci, j, :rows]) for j in use]
    return scores


def _internal(d: dict, ci: int, agg, rows: int = ROWS) -> float:
    sig, noise = np.asarray(d["sig"]), np.asarray(d["noise"])
    f = d["candidates"][ci]["float"]
    js = [i for i, (k, _) in enumerate(d["probes"]) if k == "internal"]
    return float(np.mean([agg(sig[f, j, :rows], noise[ci, j, :rows]) for j in js])) if js else CAP


def rule(agg, kinds: str = "out", internal: bool = False, rows: int = ROWS):
    def score(d: dict, ci: int) -> float:
        s = _output_scores(d, ci, agg, kinds, rows)
        if internal:
            s = s + [_internal(d, ci, agg, rows)]
        return min(s) + float(np.mean(s))
    return score


RULES = {  # the first is the score before this bench; "new" is the one ptq/choose.py keeps
    "old (per-row mean)": rule(per_row),
    "(a) pre-activation, per-row": rule(per_row, "pre"),
    "(a) output+pre-activation, per-row": rule(per_row, "both"),
    "(d) all calibration rows, per-row": rule(per_row, rows=MEASURED_ROWS),
    "(b) pooled": rule(pooled),
    "(b+d) pooled, all rows": rule(pooled, rows=MEASURED_ROWS),
    "(b) weighted per-row": rule(weighted),
    "(b) weighted per-row, quiet 1e-2": rule(quiet(1e-2)),
    "(b) weighted per-row, quiet 1e-3": rule(quiet(1e-3)),
    "new: per-row, near-silent rows weighed (ptq/choose.py output_snr)": rule(quiet(1e-6)),
    "(a+b) pre-activation, pooled": rule(pooled, "pre"),
    "(a+b) pre-activation, weighted": rule(weighted, "pre"),
    "(a+b) pre-activation, weighted 1e-3": rule(quiet(1e-3), "pre"),
    "(a+b) output+pre-activation, weighted": rule(weighted, "both"),
    "(c) outputs + internal mean, per-row": rule(per_row, internal=True),
    "(b+c) outputs + internal mean, weighted": rule(weighted, internal=True),
}


def greedy(d: dict, score) -> int:
    """ptq/choose.py's search: the best estimator; bias correction on it (kept when it changes a bias);
    equalisation with the best so far, with and without bias correction; the best of all tried."""
    cands = d["candidates"]

    def find(method: str, eq: bool, bc: bool) -> int | None:
        return next((i for i, c in enumerate(cands) if (c["method"], c["eq"], c["bc"]) == (method, eq, bc)), None)

    tried = [i for i, c in enumerate(cands) if not c["eq"] and not c["bc"]]
    best = max(tried, key=lambda i: score(d, i))
    bc = find(cands[best]["method"], False, True)
    if cands[bc]["corrected"]:
        tried.append(bc)
    method = cands[max(tried, key=lambda i: score(d, i))]["method"]
    eq = find(method, True, False)
    if eq is not None:
        tried.append(eq)
        ebc = find(method, True, True)
        if cands[ebc]["corrected"]:
            tried.append(ebc)
    return max(tried, key=lambda i: score(d, i))


def held_snr(d: dict, ci: int, which: str | None = None) -> float:
    """The model's held-back figure: the worst output's pooled SNR (bench/real_routes.py's), on the held-back
    set `which` (default: the first measured)."""
    h = d["held"][which or next(iter(d["held"]))]
    hs, hn = np.asarray(h["sig"]), np.asarray(h["noise"])
    return min(pooled(hs[o], hn[ci, o]) for o in range(len(d["outputs"])))


def name(c: dict) -> str:
    return c["method"] + ("+eq" if c["eq"] else "") + ("+bc" if c["bc"] else "")


def geomean(xs: list[float]) -> float:
    xs = [max(x, 0.01) for x in xs]
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def table(args: argparse.Namespace) -> None:
    data = [json.loads(p.read_text()) for p in sorted(args.work.glob("*.json"))]
    sets = list(data[0]["held"])
    lines = [f"Regenerate: `{args.command}`", ""] if args.command else []
    picks = {r: [greedy(d, f) for d in data] for r, f in RULES.items()}
    base = picks[next(iter(RULES))]
    for h in sets:
        old = [held_snr(d, ci, h) for d, ci in zip(data, base, strict=True)]
        positive = [k for k, v in enumerate(old) if v > 0]
        lines += [f"Held-back set `{h}`: the pick's SNR vs float, dB, worst output. Geomean over the {len(positive)} "
                  "models above 0 dB with the old rule; mean, worst, and the change against the old rule's pick over "
                  f"all {len(data)}.", "",
                  "| rule | geomean dB | mean dB | worst dB | mean change dB | worst change dB | better / worse "
                  "| models whose pick moved (dB old -> this rule) |", "|---|---:|---:|---:|---:|---:|---|---|"]
        for r in RULES:
            snrs = [held_snr(d, ci, h) for d, ci in zip(data, picks[r], strict=True)]
            delta = [a - b for a, b in zip(snrs, old, strict=True)]
            moved = [f"{d['model']} {held_snr(d, b, h):.2f} -> {held_snr(d, ci, h):.2f}"
                     for d, ci, b in zip(data, picks[r], base, strict=True) if ci != b]
            lines.append(f"| {r} | {geomean([snrs[k] for k in positive]):.2f} | {np.mean(snrs):.2f} | "
                         f"{min(snrs):.2f} | {np.mean(delta):+.2f} | {min(delta):+.2f} | "
                         f"{sum(x > 0.005 for x in delta)} / {sum(x < -0.005 for x in delta)} | {'; '.join(moved)} |")
        lines.append("")
    lines += ["Per model: the pick and its held-back SNR (" + " / ".join(sets) + "); the best and the worst of the "
              "candidates on the first set.", "",
              "| model | " + " | ".join(RULES) + " | best | worst |", "|---|" + "---|" * (len(RULES) + 2)]
    for k, d in enumerate(data):
        all_ = [held_snr(d, i) for i in range(len(d["candidates"]))]

        def cell(ci: int, d=d) -> str:
            return f"{name(d['candidates'][ci])} " + " / ".join(f"{held_snr(d, ci, h):.2f}" for h in sets)

        hi, lo = int(np.argmax(all_)), int(np.argmin(all_))
        lines.append(f"| {d['model']} | " + " | ".join(cell(picks[r][k]) for r in RULES) +
                     f" | {cell(hi)} | {cell(lo)} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("specs", nargs="+", type=Path)
    m.add_argument("--heldout", type=Path, nargs="+", required=True)
    m.add_argument("--work", type=Path, required=True)
    m.add_argument("--only", nargs="*", default=[])
    t = sub.add_parser("table")
    t.add_argument("--work", type=Path, required=True)
    t.add_argument("--out", type=Path)
    t.add_argument("--command", default="")
    args = ap.parse_args(argv)
    measure(args) if args.cmd == "measure" else table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
