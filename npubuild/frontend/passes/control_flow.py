"""Fold control flow that the model's constants and static shapes decide: If and Loop, at import.

Exporters leave control flow in models whose every run takes the same path once the input shapes are
fixed: torch's `if x.shape[1] == 512` (Silero VAD's 16 kHz export: twelve If nodes on shapes, nested in
each other's branches), a sample-rate switch on a constant, TorchScript's `for i in range(4)` as a Loop of
a constant trip count. Nothing on an NPU runs an If or a Loop (Vela emits no branch from TOSA input), and
left in the graph each one puts everything inside it on the host. So, first of all the import passes:

- an If whose condition follows from constants and static shapes (its producers, evaluated with ONNX's
  reference evaluator as fold_constants does, stop at Shape/Size of a static tensor and at constants)
  becomes the nodes of the branch it takes;
- a Loop whose trip count is such a constant, whose condition input is absent or true and whose body
  passes its condition through unchanged (or returns true), becomes that many copies of its body: its
  loop-carried values threaded through, each scan output the Concat of its iterations' values.

A condition that depends on the data stays an If (frontend/passes/if_select.py turns the cheap ones
into a select; the rest runs on the host, placed with the reason). Nested control flow folds from the
outside in: the import stage re-infers shapes and runs this pass again until nothing folds
(frontend/normalise.py), so an If inside an inlined branch, or one on a shape an inlined branch made
static, folds in the next round.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import HOST_REASON, register
from npubuild.frontend.passes.fold import MAX_FOLDED_ELEMENTS, NON_DETERMINISTIC, evaluate_node

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
MAX_UNROLLED_NODES = 2500
def mark_host(node: ir.Node, reason: str) -> bool:
    """Say, on the node itself, why it stays control flow: the lowering names it as the node's host reason.
    Whether that changed the node (a pass reports a change once, so the import's rounds end)."""
    text = f"{HOST_REASON}{reason}"
    if node.doc_string == text:
        return False
    node.doc_string = text
    return True  # a bigger unrolled Loop is refused by the quantiser anyway (frontend/quantize.py)


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def _static_shape(value: ir.Value) -> list[int] | None:
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return list(value.shape)


class StaticValues:
    """The values a graph's constants and static shapes decide, evaluated on demand and remembered."""

    def __init__(self, opset: int):
        self.opset = opset
        self.known: dict[ir.Value, np.ndarray | None] = {}

    def value(self, target: ir.Value | None) -> np.ndarray | None:
        """`target`'s array if it follows from constants and static shapes, else None (an explicit stack:
        a condition may sit at the end of a long chain)."""
        if target is None:
            return None
        stack = [target]
        while stack:
            v = stack[-1]
            if v in self.known:
                stack.pop()
                continue
            missing = self._missing_inputs(v)
            if missing is None:  # cannot be static: a graph input, a random or control-flow node...
                self.known[v] = None
                stack.pop()
            elif missing:
                stack.extend(missing)
            else:
                self.known[v] = self._evaluate(v)
                stack.pop()
        return self.known[target]

    def _missing_inputs(self, v: ir.Value) -> list[ir.Value] | None:
        """The inputs of v's producer still to evaluate ([] when ready), or None if v cannot be static."""
        if v.const_value is not None:
            return []
        node = v.producer()
        if node is None or node.domain not in ("", "ai.onnx") or node.op_type in NON_DETERMINISTIC \
                or _has_subgraph(node):
            return None
        if node.op_type in ("Shape", "Size"):
            return [] if node.inputs and node.inputs[0] is not None and _static_shape(node.inputs[0]) else None
        if node.op_type != "Constant" and not node.inputs:
            return None
        pending = []
        for i in node.inputs:
            if i is None or i in self.known and self.known[i] is not None:
                continue
            if i in self.known:  # known not static
                return None
            pending.append(i)
        return pending

    def _evaluate(self, v: ir.Value) -> np.ndarray | None:
        if v.const_value is not None:
            return v.const_value.numpy()
        node = v.producer()
        assert node is not None
        if node.op_type == "Shape":
            shape = _static_shape(node.inputs[0]) or []
            start = node.attributes.get_int("start", 0)
            end = node.attributes.get_int("end", len(shape))
            results = [np.asarray(shape[slice(start, end)], np.int64)]
        elif node.op_type == "Size":
            results = [np.asarray(int(np.prod(_static_shape(node.inputs[0]) or [])), np.int64)]
        else:
            inputs = [None if i is None else self.known[i] for i in node.inputs]
            try:
                results = evaluate_node(node, inputs, self.opset)
            except Exception:  # noqa: BLE001 - the evaluator lacks this op or these types: not static here
                return None
        for out, arr in zip(node.outputs, results, strict=False):
            arr = np.asarray(arr)
            self.known[out] = arr if arr.size <= MAX_FOLDED_ELEMENTS else None
        return self.known.get(v)


def _condition(values: StaticValues, cond: ir.Value | None) -> bool | None:
    arr = values.value(cond)
    if arr is None or arr.size != 1:
        return None
    return bool(arr.reshape(-1)[0])


class Namer:
    """Unique names for the nodes and values moved out of a subgraph into the graph around it."""

    def __init__(self, graph: ir.Graph):
        self.values = {v.name for v in graph.inputs} | set(graph.initializers)
        self.nodes: set[str] = set()
        for node in ir.traversal.RecursiveGraphIterator(graph):
            self.nodes.add(node.name or "")
            self.values.update(o.name for o in node.outputs if o.name)

    def claim(self, name: str | None, taken: set[str], prefix: str) -> str | None:
        if name is None:
            return None
        new, n = name, 0
        while new in taken:
            n += 1
            new = f"{prefix}/{name}" if n == 1 else f"{prefix}/{name}_{n}"
        taken.add(new)
        return new

    def adopt(self, nodes: list[ir.Node], prefix: str) -> None:
        for node in nodes:
            node.name = self.claim(node.name, self.nodes, prefix)
            for out in node.outputs:
                out.name = self.claim(out.name, self.values, prefix)


def splice(graph: ir.Graph, anchor: ir.Node, body: ir.Graph, namer: Namer, prefix: str) -> list[ir.Value]:
    """Move `body`'s nodes and initializers into `graph` before `anchor`; `body`'s outputs, freed to be used."""
    outputs = list(body.outputs)
    body.outputs.clear()
    nodes = list(body)
    body.remove(nodes)
    for name in list(body.initializers):
        init = body.initializers.pop(name)
        init.name = namer.claim(init.name, namer.values, prefix)
        graph.register_initializer(init)
    namer.adopt(nodes, prefix)
    graph.insert_before(anchor, nodes)
    return outputs


def connect(graph: ir.Graph, anchor: ir.Node, old: ir.Value, new: ir.Value, namer: Namer) -> None:
    """Readers of `old` (an output of the control-flow node) read `new`; a graph output keeps its name, through
    an Identity when `new` cannot take the name (an input, an initializer, another output, an outer value)."""
    if not old.is_graph_output():
        ir.convenience.replace_all_uses_with(old, new)
        return
    producer = new.producer()
    if new.is_graph_input() or new.is_initializer() or new.is_graph_output() or producer is None \
            or producer.graph is not graph:
        identity = ir.node("Identity", [new], name=namer.claim(f"{old.name}_identity", namer.nodes, anchor.name or ""))
        graph.insert_before(anchor, identity)
        new = identity.outputs[0]
    name = old.name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    old.name = f"{name}__folded"
    new.name = name
    new.type = new.type or old.type


def _inline_if(graph: ir.Graph, node: ir.Node, taken: bool, namer: Namer) -> bool:
    attr = node.attributes.get("then_branch" if taken else "else_branch")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return False
    branch = attr.as_graph()
    if len(branch.outputs) != len(node.outputs):
        return False
    formal = splice(graph, node, branch, namer, node.name or "If")
    for old, new in zip(node.outputs, formal, strict=True):
        connect(graph, node, old, new, namer)
    graph.remove(node, safe=True)
    return True


def _loop_trip_count(values: StaticValues, node: ir.Node, body: ir.Graph) -> int | None:
    """The number of iterations a Loop runs whatever its data, or None."""
    trip = values.value(node.inputs[0] if node.inputs else None)
    if trip is None or trip.size != 1:
        return None
    cond_in = node.inputs[1] if len(node.inputs) > 1 else None
    if cond_in is not None and _condition(values, cond_in) is not True:
        return None
    cond_body_in, cond_out = body.inputs[1], body.outputs[0]
    passes_through = cond_out is cond_body_in or (
        cond_out.producer() is not None and cond_out.producer().op_type == "Identity"
        and cond_out.producer().inputs[0] is cond_body_in)
    if not passes_through and _condition(StaticValues(values.opset), cond_out) is not True:
        return None
    return int(trip.reshape(-1)[0])


def _unroll_loop(graph: ir.Graph, node: ir.Node, values: StaticValues, namer: Namer) -> bool:
    attr = node.attributes.get("body")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return False
    body = attr.as_graph()
    carried_in = list(node.inputs[2:])
    n_carried = len(carried_in)
    if len(body.inputs) != 2 + n_carried or len(body.outputs) < 1 + n_carried:
        return False
    trips = _loop_trip_count(values, node, body)
    if trips is None or trips < 1 or trips * max(len(body), 1) > MAX_UNROLLED_NODES:
        return False
    n_scan = len(body.outputs) - 1 - n_carried
    carried: list[ir.Value] = list(carried_in)
    scans: list[list[ir.Value]] = [[] for _ in range(n_scan)]
    prefix = node.name or "Loop"
    for i in range(trips):
        copy = body.clone(allow_outer_scope_values=True)
        step = ir.Value(name=namer.claim(f"{prefix}_iter{i}", namer.values, prefix),
                        const_value=ir.tensor(np.asarray(i, np.int64)), shape=ir.Shape([]),
                        type=ir.TensorType(ir.DataType.INT64))
        graph.register_initializer(step)
        true = ir.Value(name=namer.claim(f"{prefix}_cond{i}", namer.values, prefix),
                        const_value=ir.tensor(np.asarray(True)), shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
        graph.register_initializer(true)
        formal_in = list(copy.inputs)
        copy.inputs.clear()
        for formal, actual in zip(formal_in, [step, true, *carried], strict=True):
            ir.convenience.replace_all_uses_with(formal, actual)
        outs = splice(graph, node, copy, namer, f"{prefix}/iter{i}")
        carried = outs[1:1 + n_carried]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
    for old, new in zip(node.outputs[:n_carried], carried, strict=True):
        connect(graph, node, old, new, namer)
    for k, old in enumerate(node.outputs[n_carried:]):
        axis0 = ir.Value(name=namer.claim(f"{prefix}_scan_axis", namer.values, prefix),
                         const_value=ir.tensor(np.asarray([0], np.int64)), shape=ir.Shape([1]),
                         type=ir.TensorType(ir.DataType.INT64))
        graph.register_initializer(axis0)
        rows = []
        for v in scans[k]:
            unsq = ir.node("Unsqueeze", [v, axis0], name=namer.claim(f"{prefix}_scan{k}_unsqueeze", namer.nodes, prefix))
            graph.insert_before(node, unsq)
            rows.append(unsq.outputs[0])
        concat = ir.node("Concat", rows, attributes={"axis": 0},
                         name=namer.claim(f"{prefix}_scan{k}_concat", namer.nodes, prefix))
        graph.insert_before(node, concat)
        connect(graph, node, old, concat.outputs[0], namer)
    graph.remove(node, safe=True)
    return True


def fold_graph(graph: ir.Graph, values: StaticValues, namer: Namer) -> bool:
    """One sweep over `graph` (in order, so an If inlined early can make a later condition static)."""
    modified = False
    for node in list(graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "If":
            taken = _condition(values, node.inputs[0] if node.inputs else None)
            if taken is not None and _inline_if(graph, node, taken, namer):
                modified = True
        elif node.op_type == "Loop":
            if _unroll_loop(graph, node, values, namer):
                modified = True
            else:
                modified |= mark_host(node, "a Loop whose trip count or condition depends on the data (or past "
                                            f"{MAX_UNROLLED_NODES} nodes unrolled): it runs whole on the host")
    return modified


@register("fold_control_flow")
class FoldControlFlow(ir.passes.InPlacePass):
    """If and Loop nodes whose path constants and static shapes decide, replaced by the path they take."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        values = StaticValues(model.opset_imports.get("", 13))
        namer = Namer(model.graph)
        modified = fold_graph(model.graph, values, namer)
        for sub in list(model.graph.subgraphs()):  # control flow inside a branch that stays (data-dependent)
            modified |= fold_graph(sub, values, namer)
        return ir.passes.PassResult(model, modified)
