"""Per-layer numerics: every ONNX node's output on the TOSA reference model against onnxruntime.

The lowering turns any Q/DQ-ed tensor that is a graph output into a TOSA
output, so the model is re-lowered with every compute node's (quantised)
output exposed as an extra graph output. Each is compared with the QDQ model
on onnxruntime (the integer graph's own error, in LSB) and with the float
model (what quantisation costs so far, as SNR). The first node where the
error jumps is where to look: a bad calibration range, a clipping
activation, a lowering bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from npubuild.errors import InputError, NpubuildError, UncomputedOutputError
from npubuild.frontend.graph_index import GraphIndex
from npubuild.frontend.passes import run_passes
from npubuild.lowering.driver import lower_model
from npubuild.lowering.fallback import cut_model, lower_lowerable
from npubuild.records.iospec import IOSpec
from npubuild.tosa.run import OnnxSession, run_tosa
from npubuild.verify.numerics import SNR_CAP_DB, cosine, snr_db

QDQ = {"QuantizeLinear", "DequantizeLinear"}
JUMP_DB = 20.0  # an SNR this much below the node before it is a jump
FLOOR_DB = 20.0  # falling below this (from above it) is a jump too, however gradual the way down
CEILING_DB = 60.0  # SNRs above this count as this much when looking for a jump
MAX_LSB = 1.0  # the integer graph may differ from the QDQ model by one rounding step
DRIFT_DB = 1.0  # the integer graph this much further from float than the QDQ model is: it adds loss of its own


@dataclass
class Probe:
    """One observable tensor: the node that makes it, its name in the float model and in the lowered model."""

    node: str
    op_type: str
    float_name: str
    exposed_name: str


def find_probes(model: onnx.ModelProto, profile: str) -> list[Probe]:
    """The graph input(s) and every compute node's first output, as the lowering can expose them."""
    index = GraphIndex(model)
    probes = []
    if profile == "int":  # the input's own quantisation is the first place error enters
        for vi in model.graph.input:
            copy = index.quantized_copy(vi.name) if vi.name not in index.inits else None
            if copy is not None:
                probes.append(Probe(vi.name, "input", vi.name, copy))
    for n in model.graph.node:
        if n.op_type in QDQ or not n.output:
            continue
        out = n.output[0]
        if profile == "fp":
            probes.append(Probe(n.name, n.op_type, out, out))
            continue
        copy = index.quantized_copy(out)
        if copy is not None:
            float_name = out if not out.endswith("_QuantizeLinear_Input") else out[: -len("_QuantizeLinear_Input")]
            probes.append(Probe(n.name, n.op_type, float_name, copy))
    return probes


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The model with `names` exposed as graph outputs, each of its known element type (float if unknown: an
    int64 shape computation exposed as float was an invalid model for onnxruntime)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*m.graph.value_info, *m.graph.input]
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    for name in names:
        if name not in have:
            m.graph.output.append(helper.make_tensor_value_info(name, types.get(name, TensorProto.FLOAT), None))
            have.add(name)
    return m


def prepare(model: onnx.ModelProto, passes: list[str]) -> onnx.ModelProto:
    """The model as the lower stage sees it (pipeline passes applied), node names filled in."""
    model = ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(model), passes))
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    return model


def lower_exposed(model: onnx.ModelProto, probes: list[Probe], profile: str):
    """Lower with every probe exposed; probes the lowering cannot expose (fused away) are dropped.

    Exposing one tensor can stop a pattern from fusing over it and so change
    which other tensors exist: a probe that lowers alone may be fused away
    beside the others, so the combined lowering is retried without each
    output it names as not computed.
    """
    try:
        lowered = lower_model(with_outputs(model, [p.exposed_name for p in probes]), profile)
        return lowered, probes
    except NpubuildError:
        pass
    kept = []
    for p in probes:
        try:
            lower_model(with_outputs(model, [p.exposed_name]), profile)
            kept.append(p)
        except NpubuildError:
            continue
    while True:
        try:
            return lower_model(with_outputs(model, [p.exposed_name for p in kept]), profile), kept
        except UncomputedOutputError as exc:
            left = [p for p in kept if p.exposed_name != exc.output_name]
            if len(left) == len(kept):  # a real graph output: nothing to drop
                raise
            kept = left


def layer_numerics(lower_input: onnx.ModelProto, float_model: onnx.ModelProto, passes: list[str], profile: str,
                   samples: dict[str, np.ndarray]) -> dict:
    """Per-probe error measures over the samples, and the first probe where the error jumps."""
    model = prepare(lower_input, passes)
    # nodes the lowering leaves to the host (an op with no TOSA form, a layer the spec keeps in float) are cut out:
    # the integer graph of the rest reads the QDQ model's own values of their outputs
    found = lower_lowerable(model, profile).host
    host = [n.name for n in model.graph.node if n.name in found]  # in graph order
    graph = cut_model(model, set(host)) if host else model
    if not graph.graph.node:
        raise InputError("every node of this build runs on the host: there is no integer graph to compare")
    # a graph input's row is input_row's (the TOSA graph takes it already quantised): its exposed copy would only
    # be an IDENTITY of the placeholder (lowering/driver.copy_to_output)
    probes = [p for p in find_probes(graph, profile) if p.op_type != "input"]
    lowered, probes = lower_exposed(graph, probes, profile)
    specs = {o.onnx_name: o for o in lowered.outputs}
    probes = [p for p in probes if p.exposed_name in specs]
    boundary = [s.onnx_name for s in lowered.inputs if s.onnx_name not in samples]  # host outputs the graph reads
    reference = OnnxSession(with_outputs(model, [p.exposed_name for p in probes] + boundary).SerializeToString())
    float_names = {n for node in float_model.graph.node for n in node.output} | {i.name for i in float_model.graph.input}
    flt_probes = [p.float_name for p in probes if p.float_name in float_names]
    float_run = OnnxSession(with_outputs(float_model, flt_probes).SerializeToString())
    acc: dict[str, dict[str, list]] = {p.exposed_name: {"tosa": [], "q": [], "ref": [], "flt": []} for p in probes}
    n = next(iter(samples.values())).shape[0]
    for i in range(n):
        feeds = {k: v[i] for k, v in samples.items()}
        ref, flt = reference(feeds), float_run(feeds)
        got = run_tosa(lowered.tosa, lowered, {**feeds, **{b: ref[b] for b in boundary}})
        flt.update(feeds)
        for p in probes:
            spec, a = specs[p.exposed_name], acc[p.exposed_name]
            raw = got[p.exposed_name]
            a["q"].append(raw)
            a["tosa"].append(spec.dequantize(raw))
            a["ref"].append(ref[p.exposed_name])
            if p.float_name in flt:
                a["flt"].append(flt[p.float_name])
    rows = [input_row(spec, samples[spec.onnx_name]) for spec in lowered.inputs
            if spec.dtype != "float32" and spec.onnx_name in samples]
    for p in probes:
        spec, a = specs[p.exposed_name], acc[p.exposed_name]
        tosa, ref = np.stack(a["tosa"]), np.stack(a["ref"])
        row = {"node": p.node, "op_type": p.op_type, "tensor": p.float_name,
               "tosa_snr_db": snr_db(ref, tosa), "cosine": cosine(ref, tosa),
               "max_error_lsb": None, "quant_snr_db": None, "qdq_snr_db": None, "scale": spec.scale,
               "zero_point": spec.zero_point}
        if spec.dtype != "float32":
            row["max_error_lsb"] = float(spec.lsb_error(ref, np.stack(a["q"])).max())
        if a["flt"]:
            row["quant_snr_db"] = snr_db(np.stack(a["flt"]), tosa)
            row["qdq_snr_db"] = snr_db(np.stack(a["flt"]), ref)  # what the QDQ model itself keeps of float
        rows.append(row)
    return {"profile": profile, "samples": n, "layers": rows, "host_nodes": host, **first_jump(rows)}


def input_row(spec: IOSpec, x: np.ndarray) -> dict:
    """The graph input's own quantisation (the TOSA graph takes it already quantised): error enters here first."""
    deq = spec.through_qdq(x)
    return {"node": spec.onnx_name, "op_type": "graph input", "tensor": spec.onnx_name,
            "tosa_snr_db": SNR_CAP_DB, "cosine": cosine(x, deq), "max_error_lsb": 0.0,
            "quant_snr_db": snr_db(x, deq), "qdq_snr_db": snr_db(x, deq), "scale": spec.scale,
            "zero_point": spec.zero_point}


def first_jump(rows: list[dict]) -> dict:
    """The first node where the integer graph leaves the QDQ model (> 1 LSB), the first where it is further from
    float than the QDQ model (by DRIFT_DB: where the deployed graph starts to lose accuracy of its own, which
    1-LSB steps grown through a sensitive network can do without any node leaving the QDQ model by more than
    one), and where SNR vs float jumps (where quantisation loses it)."""
    out: dict = {"first_lowering_error": None, "first_drift": None, "drift_reason": None, "first_jump": None,
                 "jump_reason": None}
    for r in rows:
        if r["max_error_lsb"] is not None and r["max_error_lsb"] > MAX_LSB:
            out["first_lowering_error"] = r["node"]
            break
    for r in rows:
        q, d = r.get("qdq_snr_db"), r.get("quant_snr_db")
        if q is not None and d is not None and d < min(q, CEILING_DB) - DRIFT_DB:
            out["first_drift"] = r["node"]
            out["drift_reason"] = f"SNR vs float {d:.1f} dB, the QDQ model's {q:.1f} dB"
            break
    prev: float | None = None
    for r in rows:
        snr = r["quant_snr_db"] if r["quant_snr_db"] is not None else r["tosa_snr_db"]
        if prev is None:
            jump = snr < FLOOR_DB
        else:  # int8 keeps about 50 dB at best: an exact tensor before is no reason to flag the next one
            jump = snr < min(prev, CEILING_DB) - JUMP_DB or snr < FLOOR_DB <= prev
        if jump:
            out["first_jump"] = r["node"]
            out["jump_reason"] = f"SNR vs float {snr:.1f} dB" + ("" if prev is None else f", {prev:.1f} dB before it")
            break
        prev = snr
    return out


def render_table(result: dict) -> str:
    """The per-node table the command prints, the first jump marked with '<<'."""
    def cut(text: str, width: int) -> str:
        return text if len(text) <= width else text[:width - 1] + "\u2026"

    node_w = min(48, max([4, *(len(r["node"]) for r in result["layers"])]))
    op_w = min(24, max([2, *(len(r["op_type"]) for r in result["layers"])]))
    gap = "   "  # columns apart: a header of several words must not read into the next one
    lines = [f"{'node':<{node_w}}{gap}{'op':<{op_w}}{gap}{'SNR vs QDQ dB':>13}{gap}{'max LSB':>7}{gap}"
             f"{'SNR vs float dB':>15}{gap}{'QDQ vs float dB':>15}"]
    for r in result["layers"]:
        mark = ""
        if r["node"] == result["first_jump"]:
            mark = "  << error jumps here"
        if r["node"] == result["first_lowering_error"]:
            mark += "  << integer graph leaves the QDQ model here"
        if r["node"] == result.get("first_drift"):
            mark += "  << integer graph further from float than the QDQ model from here"
        lsb = "-" if r["max_error_lsb"] is None else f"{r['max_error_lsb']:.0f}"
        q = "-" if r["quant_snr_db"] is None else f"{r['quant_snr_db']:.1f}"
        qq = "-" if r.get("qdq_snr_db") is None else f"{r['qdq_snr_db']:.1f}"
        lines.append(f"{cut(r['node'], node_w):<{node_w}}{gap}{cut(r['op_type'], op_w):<{op_w}}{gap}"
                     f"{r['tosa_snr_db']:>13.1f}{gap}{lsb:>7}{gap}{q:>15}{gap}{qq:>15}{mark}")
    if result.get("host_nodes"):
        lines.append(f"on the host, not compared (the integer graph reads the QDQ model's values of their outputs): "
                     f"{', '.join(result['host_nodes'])}")
    if result.get("first_drift") is not None:
        lines.append(f"first drift from float: {result['first_drift']} ({result['drift_reason']})")
    if result["first_jump"] is None and result["first_lowering_error"] is None:
        lines.append("no jump: the error grows smoothly through the graph")
    elif result["first_jump"] is not None:
        lines.append(f"first jump: {result['first_jump']} ({result['jump_reason']})")
    return "\n".join(lines)


def load(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))
