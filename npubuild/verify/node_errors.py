"""Each node's own error: the node lowered alone and fed the QDQ model's own int8 inputs, against the QDQ node.

The end-to-end error of an int8 graph against onnxruntime's QDQ model is not the lowering's alone:
onnxruntime runs every node in float32 (DQ -> float op -> Q), so where a value lands within ~1e-4 LSB of a
rounding boundary its float32 accumulation picks a side by chance, and a 1-LSB difference on 0.05% of a
conv's elements then grows through every layer after it (segmentation/unet: 0.05% at conv_19, 4 LSB at
the output; onnxruntime's own optimised session differs from its unoptimised one by 2 LSB on that model
and by 5 on the transformer). Feeding each node the reference's own quantised inputs is the comparison
that rounds where the hardware does: once per node. It measures what the lowering of that node adds.

A node is cut out with its input Q/DQ pairs and its output pair (onnx.utils.Extractor), lowered on its own
with the same LoweringOptions, and run on the TOSA reference model; patterns the driver fuses across nodes
are therefore measured node by node. Nodes whose cut does not lower on its own (a pattern node, a shape
computation) are left out and counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx.utils import Extractor

from npubuild.errors import NpubuildError
from npubuild.fanout import fan_out
from npubuild.frontend.graph_index import GraphIndex
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import LoweringOptions
from npubuild.tosa.run import OnnxSession, run_tosa
from npubuild.verify.debug_numerics import find_probes, prepare, with_outputs


@dataclass(frozen=True)
class NodeError:
    """One node's own error over the samples, in LSB of its output's quantisation."""

    node: str
    op_type: str
    tensor: str  # the quantised output compared
    max_error_lsb: float
    mean_error_lsb: float
    mismatched: float  # fraction of elements that differ at all
    bias_lsb: float  # mean signed error (TOSA - QDQ): a rounding bias shows here, random flips do not

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NodeErrors:
    nodes: list[NodeError]
    unchecked: list[str]  # nodes whose cut-out does not lower on its own

    @property
    def worst(self) -> NodeError | None:
        """The node with the largest error (then the most mismatched elements, then the first)."""
        if not self.nodes:
            return None
        return max(self.nodes, key=lambda e: (e.max_error_lsb, e.mismatched))

    def to_json(self) -> dict:
        worst = self.worst
        return {"max_error_lsb": worst.max_error_lsb if worst else 0.0, "worst": worst.to_json() if worst else None,
                "nodes": [e.to_json() for e in self.nodes], "unchecked": self.unchecked}


def _cut_inputs(index: GraphIndex, node: onnx.NodeProto, inits: set[str], depth: int = 0) -> set[str]:
    """Where to cut the graph in front of `node`: for each input the real value before its Q/DQ pair; a
    constant (an initializer, or the DequantizeLinear of one) stays in the cut; an input on no Q/DQ pair (a
    MatMul folded with its bias Add into one layer) takes its producer into the cut."""
    cut: set[str] = set()
    for name in node.input:
        if not name or name in inits:
            continue
        source = index.source(name)
        producer = index.producer.get(source)
        if producer is None or source != name:
            cut.add(source)
        elif producer.op_type == "DequantizeLinear" and producer.input[0] in inits:
            continue
        elif depth < 4:
            cut |= _cut_inputs(index, producer, inits, depth + 1)
        else:
            cut.add(source)
    return cut


@dataclass
class NodeCheck:
    """The per-node check made ready: its cuts and the QDQ model's own values that feed them (onnxruntime's, run
    here). `check(k)` lowers and runs cut k, pure TOSA work a worker process can do (npubuild/fanout.py);
    `collect` makes the record of all of them, in cut order."""

    cuts: list[tuple[str, str, str, list[str]]]  # node, op type, the tensor compared, the cut's inputs
    runs: list[dict[str, np.ndarray]]  # per sample: the graph inputs and every watched tensor
    extractor: Extractor
    options: LoweringOptions | None

    def check(self, index: int) -> NodeError | None:
        """Cut `index`'s error over the samples; None where the cut does not lower or run on its own."""
        node, op_type, tensor, sources = self.cuts[index]
        try:
            sub = self.extractor.extract_model(sources, [tensor])
            lowered = lower_model(sub, "int", options=self.options)
        except (NpubuildError, onnx.checker.ValidationError, KeyError, ValueError):
            return None
        spec = next((o for o in lowered.outputs if o.onnx_name == tensor), None)
        names = [i.name for i in sub.graph.input]
        if spec is None or not spec.quantized or any(name not in self.runs[0] for name in names):
            return None
        try:  # the TOSA reference model may refuse a cut it would run inside the whole graph: not measured
            got = [run_tosa(lowered.tosa, lowered, {k: np.asarray(r[k]) for k in names})[tensor] for r in self.runs]
        except NpubuildError:
            return None
        e = np.concatenate([(np.asarray(g, np.float64) - spec.quantize_reference(np.asarray(r[tensor], np.float64))).ravel()
                            for g, r in zip(got, self.runs, strict=True)])
        return NodeError(node, op_type, tensor, float(np.abs(e).max()), float(np.abs(e).mean()),
                         float(np.mean(e != 0)), float(e.mean()))

    def run_all(self, expected_s: float) -> NodeErrors:
        """Every cut, over worker processes when `expected_s` (their reference-model time) is worth it."""
        return self.collect(fan_out(self.check, len(self.cuts), expected_s))

    def collect(self, checked: list[NodeError | None]) -> NodeErrors:
        return NodeErrors([e for e in checked if e is not None],
                          [cut[0] for cut, e in zip(self.cuts, checked, strict=True) if e is None])


def prepare_node_check(lower_input: onnx.ModelProto, passes: list[str], samples: dict[str, np.ndarray],
                       options: LoweringOptions | None = None) -> NodeCheck:
    """Every quantised compute node's cut (INT profile), and the QDQ model run once per sample (arrays stacked
    on axis 0) for the values that feed the cuts."""
    model = onnx.shape_inference.infer_shapes(prepare(lower_input, passes))
    index = GraphIndex(model)
    inits = {i.name for i in model.graph.initializer}
    cuts: list[tuple[str, str, str, list[str]]] = []
    nodes = {n.name: n for n in model.graph.node}
    for p in find_probes(model, "int"):
        if p.op_type == "input":
            continue
        sources = sorted(_cut_inputs(index, nodes[p.node], inits))
        cuts.append((p.node, p.op_type, p.exposed_name, sources))
    watched = sorted({t for *_, srcs in cuts for t in srcs} | {c[2] for c in cuts})
    full = OnnxSession(with_outputs(model, watched).SerializeToString())
    n = next(iter(samples.values())).shape[0]
    runs = []
    for i in range(n):
        feeds = {k: v[i] for k, v in samples.items()}
        runs.append({**feeds, **full(feeds)})
    return NodeCheck(cuts, runs, Extractor(model), options)


def node_errors(lower_input: onnx.ModelProto, passes: list[str], samples: dict[str, np.ndarray],
                options: LoweringOptions | None = None, expected_s: float = 0.0) -> NodeErrors:
    """Every quantised compute node's own error (INT profile) over the samples (arrays stacked on axis 0).
    The cuts are lowered and run in worker processes (npubuild/fanout.py) when `expected_s`, the caller's
    estimate of their reference-model time, is worth it."""
    return prepare_node_check(lower_input, passes, samples, options).run_all(expected_s)
