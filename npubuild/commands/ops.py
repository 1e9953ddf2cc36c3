"""`npubuild ops`: every ONNX op type npubuild lowers, and where it runs on each Ethos-U family.

Not a hand-kept table: each op type in the lowering registry is lowered for real, as a small int8 model
(quantised by onnxruntime as the quantize stage does, lowered per family as the lower stage does), and
the family's support rules (ethosu/support.py, from Vela's TOSA constraints) place it, exactly as in a
build. Then the same model with every activation that may be 16-bit on the family made so (16x8, as
`quantization: {activations: int16}` builds it, frontend/precision) is lowered again: the `int16` columns say
the precision the node got on each family (16: an int16 form; 8: it keeps int8 there). Rules that depend on shapes or types (RESIZE on U55/U65, ARGMAX channels, comparison types) are
named beside the op types whose TOSA ops they can reject. An op type not listed has no lowering: a model
using it runs that node on the host (onnxruntime), with the reason in the offload report. Like `vela --supported-ops-report`, but per ONNX op.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npubuild.config.accelerator import FAMILIES

# op types the frontend removes or absorbs before lowering: no node of their own reaches a family
STRUCTURAL = {
    "QuantizeLinear": "absorbed: int8 scales and zero points of the integer ops around it",
    "DequantizeLinear": "absorbed: int8 scales and zero points of the integer ops around it",
    # onnxruntime's contrib Q/DQ (its quantiser writes them for 16-bit and 4-bit types below opset 21)
    "com.microsoft:QuantizeLinear": "absorbed: int8/int16 scales and zero points of the integer ops around it",
    "com.microsoft:DequantizeLinear": "absorbed: int8/int16 scales and zero points of the integer ops around it",
    "Constant": "folded into the constants of the ops that read it",
    "Identity": "removed by the pipeline (eliminate_identity)",
    "Dropout": "removed by the pipeline (eliminate_dropout; inference only)",
}
# support rules that depend on a node's shapes or types, and the TOSA ops they look at (ethosu/support.py)
CONDITIONAL = {
    "u55-resize": ({"RESIZE"}, "on U55/U65 only 2x/4x/8x nearest pixel replication; other resizes run on the CPU"),
    "u55-argmax-channels": ({"ARGMAX"}, "on U55/U65 at most 127 channels"),
    "comparison-int32": ({"EQUAL", "GREATER", "GREATER_EQUAL"}, "Vela compares INT32 only"),
}
X = [1, 8, 8, 8]
OPS_ALIGN = 36  # the TOSA ops column's alignment width (its cells are never cut)


@dataclass(frozen=True)
class Probe:
    """A small model for one op type: `nodes` are (op, inputs, outputs, attrs); the node named `probe` is it."""

    label: str
    op: str
    inputs: dict[str, list[int]]
    nodes: tuple[tuple[str, list[str], list[str], dict], ...]
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 17
    after_conv: bool = False  # behind a 1x1 Conv: onnxruntime leaves some op types float right after an input
    same_shape: bool = False  # the output has the input's shape (for op types onnx's shape inference leaves unshaped)


def _one(op: str, inputs: dict[str, list[int]] | None = None, extra: list[str] | None = None,
         inits: dict | None = None, outputs: int = 1, label: str | None = None, opset: int = 17,
         after_conv: bool = False, same_shape: bool = False, **attrs) -> Probe:
    inputs = inputs if inputs is not None else {"x": X}
    outs = [f"y{i}" for i in range(outputs)]
    return Probe(label or op, op, inputs, ((op, [*inputs, *(extra or [])], outs, attrs),),
                 {k: np.asarray(v, dtype=np.int64 if np.asarray(v).dtype.kind == "i" else np.float32)
                  for k, v in (inits or {}).items()}, opset, after_conv, same_shape)


def _f(shape, seed: int = 0, low: float = -0.5, high: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _comparison(op: str) -> Probe:
    return Probe(op, op, {"x": X}, ((op, ["x", "thr"], ["g"], {}), ("Where", ["g", "x", "zero"], ["y0"], {})),
                 {"thr": np.float32(0.1), "zero": np.zeros(X, np.float32)})


def probes() -> list[Probe]:
    x2 = {"x": X, "x2": X}
    return [
        _one("Relu", after_conv=True),
        _one("Clip", extra=["lo", "hi"], inits={"lo": np.float32(-0.25), "hi": np.float32(0.25)}, after_conv=True),
        _comparison("Greater"), _comparison("Less"), _comparison("GreaterOrEqual"), _comparison("LessOrEqual"),
        Probe("Where", "Where", {"x": X}, (("Greater", ["x", "thr"], ["g"], {}), ("Where", ["g", "x", "zero"], ["y0"], {})),
              {"thr": np.float32(0.1), "zero": np.zeros(X, np.float32)}),
        _one("Conv", extra=["w"], inits={"w": _f([8, 8, 3, 3])}, pads=[1, 1, 1, 1]),
        _one("ConvTranspose", extra=["w"], inits={"w": _f([8, 8, 2, 2])}, strides=[2, 2]),
        _one("Gemm", {"x": [1, 16]}, ["b", "c"], {"b": _f([16, 8]), "c": _f([8], 1)}),
        _one("MatMul", {"x": [1, 16]}, ["b"], {"b": _f([16, 8])}),
        _one("MatMul", {"x": [1, 4, 16], "x2": [1, 16, 8]}, label="MatMul (two activations)"),
        _one("Concat", x2, axis=1), _one("Split", extra=["s"], inits={"s": [4, 4]}, outputs=2, axis=1),
        _one("Slice", extra=["st", "en", "ax"], inits={"st": [0], "en": [4], "ax": [1]}),
        _one("Gather", {"x": [1, 8, 16]}, ["i"], {"i": [0, 2, 3]}, axis=1),
        _one("Pad", extra=["p"], inits={"p": [0, 0, 1, 1, 0, 0, 1, 1]}),
        _one("Tile", {"x": [1, 8, 4, 4]}, ["r"], {"r": [1, 1, 2, 2]}, after_conv=True),
        _one("Expand", {"x": [1, 8, 1, 1]}, ["s"], {"s": [1, 8, 4, 4]}, after_conv=True),
        _one("Add", x2), _one("Sub", x2), _one("Mul", x2),
        _one("Div", extra=["d"], inits={"d": _f(X, 2, 0.5, 2.0)}), _one("Min", x2), _one("Max", x2),
        _one("LayerNormalization", {"x": [1, 16, 32]}, ["s", "b"], {"s": _f([32], 3, 0.5, 1.5), "b": _f([32], 4)},
             axis=-1),
        _one("InstanceNormalization", extra=["s", "b"], inits={"s": _f([8], 3, 0.5, 1.5), "b": _f([8], 4)}),
        _one("BatchNormalization", extra=["s", "b", "m", "v"],
             inits={"s": _f([8], 3, 0.5, 1.5), "b": _f([8], 4), "m": _f([8], 5), "v": _f([8], 6, 0.5, 1.5)}),
        _one("MaxPool", kernel_shape=[2, 2], strides=[2, 2]), _one("AveragePool", kernel_shape=[2, 2], strides=[2, 2]),
        _one("GlobalAveragePool"), _one("GlobalMaxPool"),
        _one("ReduceSum", extra=["a"], inits={"a": [2, 3]}), _one("ReduceMean", axes=[2, 3]),
        _one("ReduceMax", axes=[1]), _one("ReduceMin", axes=[1]),
        _one("Resize", {"x": [1, 8, 4, 4]}, ["", "sc"], {"sc": [1.0, 1.0, 2.0, 2.0]}, mode="nearest",
             label="Resize (nearest 2x)"),
        _one("Resize", {"x": [1, 8, 4, 4]}, ["", "sc"], {"sc": [1.0, 1.0, 2.0, 2.0]}, mode="linear",
             label="Resize (bilinear 2x)"),
        _one("DepthToSpace", {"x": [1, 16, 4, 4]}, blocksize=2, after_conv=True),
        _one("SpaceToDepth", blocksize=2, after_conv=True),
        _one("Reshape", {"x": [1, 8, 4, 4]}, ["s"], {"s": [1, 128]}), _one("Flatten", axis=1),
        _one("Squeeze", {"x": [1, 8, 1, 1]}, ["a"], {"a": [2, 3]}),
        _one("Unsqueeze", {"x": [1, 8]}, ["a"], {"a": [2, 3]}),
        _one("Transpose", {"x": [1, 8, 4, 6]}, perm=[0, 1, 3, 2]),
        _one("Cast", to=1, label="Cast (to float)", after_conv=True),
        _one("Softmax", {"x": [1, 8, 16]}, axis=-1), _one("LogSoftmax", {"x": [1, 8, 16]}, axis=-1),
        _one("Neg"), _one("Abs"), _one("Sqrt"), _one("Exp"), _one("Log"), _one("Reciprocal"), _one("Erf"),
        _one("Sigmoid"), _one("Tanh"), _one("Pow", extra=["e"], inits={"e": np.float32(2.0)}),
        _one("HardSigmoid"), _one("HardSwish", opset=17), _one("Gelu", opset=20), _one("LeakyRelu", alpha=0.1),
        _one("PRelu", extra=["s"], inits={"s": _f([8, 1, 1], 7, 0.05, 0.3)}),
        _one("ArgMax", axis=1, keepdims=1), _one("ArgMin", axis=1, keepdims=1),
        _one("TopK", {"x": [1, 8, 16]}, ["k"], {"k": [1]}, outputs=2, axis=-1, label="TopK (K = 1)"),
        _one("Hardmax", {"x": [1, 8, 16]}, axis=-1),
        _one("CastLike", extra=["like"], inits={"like": np.zeros([1], np.float32)}, after_conv=True),
        _one("Ceil"), _one("Floor"), _one("Round"), _one("Sign"),
        _one("Celu"), _one("Elu"), _one("Selu"), _one("Mish", opset=18), _one("Softplus"), _one("Softsign"),
        _one("ThresholdedRelu", alpha=0.2), _one("Shrink", lambd=0.1), _one("Swish", opset=24),
        _one("GatherElements", {"x": [1, 8, 4]}, ["i"], {"i": np.tile(np.array([0, 3]), (1, 8, 1))}, axis=2),
        _one("GroupNormalization", extra=["s", "b"], inits={"s": _f([8], 3, 0.5, 1.5), "b": _f([8], 4)},
             num_groups=2, opset=21, same_shape=True),
        _one("RMSNormalization", {"x": [1, 8, 16]}, ["s"], {"s": _f([16], 3, 0.5, 1.5)}, axis=-1, opset=23),
        _one("LRN", size=3), _one("LpNormalization", axis=1, p=2),
        _one("Mean", x2), _one("Sum", x2),
        *[_one(op, extra=["a"], inits={"a": [2, 3]}, opset=18)
          for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")],
        _one("ReduceProd", {"x": [1, 8, 4, 2]}, ["a"], {"a": [3]}, opset=18, label="ReduceProd (2 factors)"),
        _one("com.microsoft:Gelu", same_shape=True),
        _one("com.microsoft:FastGelu", extra=["b"], inits={"b": _f([8], 4)}, same_shape=True,
             label="com.microsoft:FastGelu (bias)"),
        _one("com.microsoft:BiasGelu", extra=["b"], inits={"b": _f([8], 4)}, same_shape=True),
        _one("com.microsoft:QuickGelu", same_shape=True, alpha=1.702),
    ]


def _model(p: Probe):
    import onnx
    from onnx import TensorProto, helper

    probed = max(i for i, (op, *_rest) in enumerate(p.nodes) if op == p.op)  # the last node of its op type
    nodes = [helper.make_node(op.rpartition(":")[2], ins, outs, name="probe" if i == probed else f"n{i}",
                              domain=op.rpartition(":")[0], **attrs)
             for i, (op, ins, outs, attrs) in enumerate(p.nodes)]  # "com.microsoft:Gelu": a domain's op
    inits = dict(p.inits)
    if p.after_conv:
        first = next(iter(p.inputs))
        channels = p.inputs[first][1]
        inits["w_pre"] = _f([channels, channels, 1, 1], 9)
        for n in nodes:
            n.input[:] = [f"{first}_conv" if i == first else i for i in n.input]
        nodes.insert(0, helper.make_node("Conv", [first, "w_pre"], [f"{first}_conv"], name="pre_conv"))
    outputs = [o for _, _, outs, _ in p.nodes[-1:] for o in outs]
    graph = helper.make_graph(nodes, p.label, [helper.make_tensor_value_info(k, TensorProto.FLOAT, s)
                                               for k, s in p.inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    domains = sorted({n.domain for n in nodes} - {""})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", p.opset)]
                              + [helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = 8
    if not domains:  # onnx's shape inference knows no contrib op: those probes say same_shape
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
    if p.same_shape:
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info(outputs[0], TensorProto.FLOAT,
                                                                     next(iter(p.inputs.values()))))
    return model


def probe(p: Probe) -> dict:
    """Lower the probe for each family: the probed node's TOSA ops and placement, or why it could not be."""
    import onnx

    from npubuild.config.accelerator import LOWERING_FAMILIES
    from npubuild.errors import NpubuildError, UnsupportedOpError
    from npubuild.ethosu.partition import plan_partitions
    from npubuild.frontend.normalise import normalise
    from npubuild.frontend.qdq_concat import share_concat_scales
    from npubuild.frontend.quantize import quantize
    from npubuild.lowering.driver import lower_model
    from npubuild.records.lower import PLACEMENT_WORD, Where

    row: dict = {"op": p.op, "label": p.label, "families": {}}
    try:
        model = normalise(_model(p), {}, p.label)
        if not any(n.name == "probe" for n in model.graph.node):
            row["note"] = "folded at import into constants or the ops around it"
            return row
        rng = np.random.default_rng(0)
        arrays = {k: rng.uniform(0.05, 1.0, (16, *s)).astype(np.float32) for k, s in p.inputs.items()}
        with tempfile.TemporaryDirectory(prefix="npubuild-ops-") as tmp:
            path = Path(tmp) / "float.onnx"
            onnx.save(model, path)
            q = {"per_channel": True, "method": "minmax", "symmetric_activations": False}
            qdq = quantize(path, arrays, q)
            share_concat_scales(qdq, False)
        for fam in LOWERING_FAMILIES:
            try:
                lowered = lower_model(qdq, "int", family=fam)
            except UnsupportedOpError as exc:  # in an int8 model it has no lowering: a build runs it on the host
                row["families"][fam] = {"where": PLACEMENT_WORD[Where.HOST], "tosa_ops": [], "rule": "no-lowering",
                                        "reason": exc.reason}
                continue
            placed = plan_partitions(qdq, lowered, fam).placements.get("probe")
            if placed is None or (not placed.tosa_ops and p.after_conv):  # lowered inside the Conv before it
                pre = plan_partitions(qdq, lowered, fam).placements.get("pre_conv")
                row["families"][fam] = {"where": "fused", "tosa_ops": sorted(set(pre.tosa_ops)) if pre else [],
                                        "rule": pre.rule if pre else None, "reason": pre.reason if pre else None}
                continue
            row["families"][fam] = {"where": PLACEMENT_WORD[placed.kind], "tosa_ops": sorted(set(placed.tosa_ops)),
                                    "rule": placed.rule, "reason": placed.reason}
        row["int16"] = {fam: int16_precision(qdq, fam) for fam in LOWERING_FAMILIES}
    except (NpubuildError, ValueError, RuntimeError) as exc:
        row["error"] = str(exc).splitlines()[0]
    return row


def int16_precision(qdq, fam: str) -> str | None:
    """The probed node's precision in the 16x8 form of its model on one family (None: it has no lowering)."""
    from npubuild.errors import NpubuildError
    from npubuild.frontend.precision.qdq import QdqModel, node_precisions
    from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan, promotable
    from npubuild.lowering.driver import lower_model

    info = QdqModel(qdq)
    groups = frozenset(g for g in info.groups if promotable(info, g, (fam,)) is None)
    mixed = apply_plan(qdq, PrecisionPlan(groups), (fam,))
    try:
        lower_model(mixed, "int", family=fam)
    except (NpubuildError, ValueError):
        return None
    return node_precisions(mixed).get("probe", "int8")


def conditions(row: dict) -> list[str]:
    """The shape- or type-dependent rules that can move this op type to the CPU."""
    ops = {o for f in row.get("families", {}).values() for o in f["tosa_ops"]}
    return [f"{rule}: {text}" for rule, (touched, text) in CONDITIONAL.items() if ops & touched]


def table(rows: list[dict]) -> str:
    """The table as text, every column as wide as its widest cell: nothing is cut (a pipe, `grep`, a file
    get every TOSA op and note; a terminal narrower than a line wraps it)."""
    from npubuild.records.lower import PLACEMENT_WORD, Where

    fams = list(FAMILIES)
    body = []
    for r in rows:
        if "error" in r or "note" in r:
            body.append((r["label"], ["-"] * len(fams), "", "", f"probe failed: {r['error']}" if "error" in r
                         else r["note"]))
            continue
        cells, notes = [], []
        for f in fams:
            v = r["families"][f]
            cells.append(v["where"].upper() if v["where"] != "fused" else "fused")
            if v["where"] == PLACEMENT_WORD[Where.HOST] and f"{v['rule']}: {v['reason']}" not in notes:
                notes.append(f"{v['rule']}: {v['reason']}")
            if v["where"] == "fused" and "fused into the op before it (its epilogue)" not in notes:
                notes.append("fused into the op before it (its epilogue)")
        notes += [f"depends: {c}" for c in conditions(r)]
        int16 = "/".join(_bits(r.get("int16", {}).get(f)) for f in fams)
        body.append((r["label"], cells, int16, ", ".join(r["families"]["u55"]["tosa_ops"]) or "-", "; ".join(notes)))
    label_w = max([len("ONNX op"), *(len(b[0]) for b in body)]) + 2
    fam_w = max(len(f) for f in fams) + 2
    int16_head = "int16 " + "/".join(fams)
    int16_w = len(int16_head) + 2
    # aligned for the usual lists; a longer one is written whole and moves its own row's notes along
    ops_w = min(OPS_ALIGN, max([len("TOSA ops (u55)"), *(len(b[3]) for b in body)])) + 2
    lines = [f"{'ONNX op':<{label_w}}" + "".join(f"{f:<{fam_w}}" for f in fams) + f"{int16_head:<{int16_w}}"
             + f"{'TOSA ops (u55)':<{ops_w}}notes",
             f"{'':<{label_w}}" + "".join(f"{'-' * (fam_w - 2):<{fam_w}}" for _ in fams) + "-" * (int16_w - 2)]
    for label, cells, int16, ops, notes in body:
        lines.append((f"{label:<{label_w}}" + "".join(f"{c:<{fam_w}}" for c in cells) + f"{int16:<{int16_w}}"
                      + f"{ops:<{ops_w - 2}}  " + notes).rstrip())
    lines.append("")
    lines.append("Families: " + ", ".join(f"{k} = {f.display}" for k, f in FAMILIES.items()) + ". NPU: compiled by Vela; "
                 "CPU: a host partition run by onnxruntime (the rule says why).")
    lines.append("int16: the precision the op gets in a 16x8 build on each family (16: its 16-bit form; 8: int8 there, "
                 "its neighbours reading and writing it through int8 copies; -: none).")
    lines.append("An ONNX op type not listed has no lowering: a build runs it on the host (rule no-lowering).")
    return "\n".join(lines)


def _bits(precision: str | None) -> str:
    """16 where the node computes or writes 16-bit activations, 8 where it stays int8, - where it has no form."""
    if precision is None:
        return "-"
    return "16" if "16" in precision else "8"


def compute_rows() -> list[dict]:
    """Every op type's row, each probe lowered for real (a few seconds: ~100 quantise + 4-family lowerings),
    spread over the cores."""
    import logging

    import onnxruntime

    from npubuild.fanout import fan_out
    from npubuild.lowering.registry import supported_op_types

    logging.getLogger().setLevel(logging.ERROR)
    onnxruntime.set_default_logger_severity(3)  # its warnings about the probes' unused initializers
    by_op: dict[str, list[Probe]] = {}
    for p in probes():
        by_op.setdefault(p.op, []).append(p)
    plan: list[dict | Probe] = []
    for op in supported_op_types():
        if op in STRUCTURAL:
            plan.append({"op": op, "label": op, "families": {}, "note": STRUCTURAL[op]})
        elif op in by_op:
            plan += by_op[op]
        else:
            plan.append({"op": op, "label": op, "families": {}, "error": "no probe model for this op type yet"})
    todo = [p for p in plan if isinstance(p, Probe)]
    done = iter(fan_out(lambda i: probe(todo[i]), len(todo), expected_s=len(todo) * 0.08))
    return [next(done) if isinstance(p, Probe) else p for p in plan]


def cache_path() -> Path | None:
    """Where the table is kept between runs: the user's cache dir, keyed by the source of this command and
    everything it imports (lowering, support rules, quantiser) and the versions of onnx, onnxruntime and
    onnx-ir, so any change that could move a row computes it again. None: no home to keep it in."""
    import os

    from npubuild.engine.versions import source_fingerprint, tool_version
    from npubuild.fileio import stable_hash

    base = os.environ.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if Path.home().is_dir() else "")
    if not base:
        return None
    key = stable_hash([source_fingerprint(__name__), [tool_version(t) for t in ("onnx", "onnxruntime", "onnx-ir",
                                                                               "numpy")]], 16)
    return Path(base) / "npubuild" / f"ops-{key}.json"


def cached_rows(fresh: bool = False) -> list[dict]:
    """The rows from the cache (well under a second) or computed and kept there (cold: 7-9 s, bench/ops_speed.md)."""
    from npubuild.fileio import write_text

    path = cache_path()
    if path is not None and not fresh:
        try:
            rows = json.loads(path.read_text())
            if isinstance(rows, list) and all(isinstance(r, dict) and "op" in r for r in rows):
                return rows
        except (OSError, ValueError):
            pass
    rows = compute_rows()
    if path is not None:
        try:
            write_text(path, json.dumps(rows))
        except OSError:  # a read-only home: computed each time, still right
            pass
    return rows


def cmd_ops(args) -> int:
    rows = cached_rows(args.fresh)
    if args.json:
        print(json.dumps([{**r, "conditions": conditions(r)} for r in rows], indent=2))
    else:
        print(table(rows))
    return 0


def register(sub) -> None:
    o = sub.add_parser("ops", help="list the ONNX ops npubuild lowers and where each runs per Ethos-U family",
                       description=__doc__.split("\n\n", 1)[1])
    o.add_argument("--json", action="store_true", help="print the table as JSON (per op: per family placement, "
                   "TOSA ops, rule and reason)")
    o.add_argument("--fresh", action="store_true", help="probe every op type again rather than read the table "
                   "kept in the user cache dir (kept per npubuild source and onnx/onnxruntime version)")
    o.set_defaults(func=cmd_ops)
