"""`precision: auto`: the fewest 16-bit activation groups and the most 4-bit weights that meet the budget.

Measured, not guessed, in three steps (a fourth on request) on the calibration samples against the float model:

1. Sensitivity. Every promotable group is int16 (the best the model can do); each group alone back in int8
   gives its loss (the output noise it adds, per output). Each weighted layer alone with int4 weights (the
   rest as chosen) gives its loss the same way. Measuring "this one worse than the best" instead of "this one
   better than int8" isolates each layer's own contribution: an int8 model's noise comes from every layer
   at once, and promoting one of many noisy layers moves the output by little.
2. Cost. Vela's estimate (ethosu/cost.py, per target) of the int8, the all-int16 and the all-int4 model, per
   ONNX node: a group's cost is the extra cycles of the nodes that write it and read it (half each), a layer's
   int4 saving the cycles its node saves and the weight bytes it halves.
3. Choice. Groups in order of loss per cycle: the shortest prefix that meets the budget (binary search over
   the prefix length, each step measured; the estimated slowdown bounds it); then layers in order of saving per
   loss: the longest prefix of int4 demotions that still meets it. The chosen plan is compiled by Vela for
   every target: a slowdown past the budget or a pool that does not fit drops the last promotions.
4. Float tail (`host_float`), only where no 16-bit plan meets the budget: the shortest tail of the graph (a
   suffix of its topological order, every node of it one the host CPU runs in float) kept in float over step
   3's plan, by binary search over its length; then the fewest of step 3's int16 groups left on the NPU that
   still meet the budget beside it (the same prefix search); compiled by Vela for every target as step 3's.
   Its host time is not estimated.

The budget's accuracy is met with a margin (MARGIN_DB) on the calibration samples, since the build measures
it again on samples it has not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from npubuild.config.schema import PrecisionBudget
from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan, constants_of, promotable

MAX_SAMPLES = 16
MARGIN_DB = 1.0  # met on the calibration samples by this much: the build measures on held-back ones
SNR_CAP_DB = 200.0

CostFn = Callable[[onnx.ModelProto], Mapping[str, "CostLike"]]


class CostLike:  # what the search reads of ethosu.cost.Cost (the frontend does not import the ethosu package)
    npu_cycles: int
    fits: bool
    node_cycles: dict[str, int]
    constants_bytes: int


@dataclass(frozen=True)
class Score:
    """A QDQ model against the float model: per-output noise and signal energy, and top-1 agreement."""

    noise: np.ndarray
    signal: np.ndarray
    top1: float | None

    @property
    def snr_db(self) -> float:
        with np.errstate(divide="ignore"):
            snr = 10 * np.log10(np.maximum(self.signal, 1e-30) / np.maximum(self.noise, 1e-300))
        return float(min(SNR_CAP_DB, np.min(snr))) if snr.size else SNR_CAP_DB

    def meets(self, budget: PrecisionBudget, margin_db: float = MARGIN_DB) -> bool:
        if budget.min_snr_db is not None and self.snr_db < budget.min_snr_db + margin_db:
            return False
        return budget.min_top1_agreement is None or (self.top1 is not None and self.top1 >= budget.min_top1_agreement)

    def to_json(self) -> dict:
        return {"snr_db": round(self.snr_db, 2), "top1_agreement": None if self.top1 is None else round(self.top1, 4)}


class Measure:
    """The float model's outputs on up to MAX_SAMPLES calibration samples, computed once; `measure(qdq)` runs a
    candidate on them (onnxruntime, QDQ semantics as the TOSA check runs it)."""

    def __init__(self, float_model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]):
        import onnxruntime as ort

        self.opts = ort.SessionOptions()
        self.opts.log_severity_level = 3
        session = ort.InferenceSession(float_model.SerializeToString(), self.opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        n = min(MAX_SAMPLES, next(iter(arrays.values())).shape[0])
        self.feeds = [{k: np.asarray(v[i]) for k, v in arrays.items() if k in names} for i in range(n)]
        self.outputs = [o.name for o in session.get_outputs()]
        runs = [session.run(self.outputs, fd) for fd in self.feeds]
        self.float_outputs = [j for j, o in enumerate(self.outputs) if np.asarray(runs[0][j]).dtype.kind == "f"]
        self.reference = [[np.asarray(r[j], np.float64) for j in self.float_outputs] for r in runs]
        self.signal = np.array([sum(float((r[k] ** 2).sum()) for r in self.reference)
                                for k in range(len(self.float_outputs))])
        self.runs = 0

    def __call__(self, qdq: onnx.ModelProto) -> Score:
        import onnxruntime as ort

        self.opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(qdq.SerializeToString(), self.opts, providers=["CPUExecutionProvider"])
        self.runs += 1
        noise = np.zeros(len(self.float_outputs))
        agree, rows = 0, 0
        for fd, ref in zip(self.feeds, self.reference, strict=True):
            got = session.run([self.outputs[j] for j in self.float_outputs], fd)
            for k, (r, g) in enumerate(zip(ref, got, strict=True)):
                g = np.asarray(g, np.float64)
                noise[k] += float(((r - g) ** 2).sum())
                if r.ndim and r.shape[-1] > 1:
                    same = np.argmax(r, axis=-1) == np.argmax(g, axis=-1)
                    agree, rows = agree + int(same.sum()), rows + same.size
        return Score(noise, self.signal, agree / rows if rows else None)


@dataclass
class Candidate:
    """A group (int16) or a layer (int4 weights): what it costs and buys."""

    name: str
    layers: list[str]
    loss: np.ndarray  # per-output noise it adds left int8 (group) or made int4 (layer)
    loss_db: float  # the SNR it costs, dB
    cycles: dict[str, int]  # per target: extra cycles (group) or cycles saved (layer, negative)
    chosen: bool = False
    bytes_saved: int = 0

    def to_json(self, kind: str) -> dict:
        d = {kind: self.name, "layers": self.layers, "chosen": self.chosen, "loss_db": round(self.loss_db, 3),
             "cycles": self.cycles}
        if kind == "layer":
            d["weight_bytes_saved"] = self.bytes_saved
        return d


def _db_between(a: Score, b: Score) -> float:
    """How many dB worse b is than a (worst output)."""
    return max(0.0, a.snr_db - b.snr_db)


def _group_cycles(info: QdqModel, group: str, c8: Mapping[str, int], c16: Mapping[str, int]) -> int:
    """Extra cycles of making `group` int16: half the 16-bit delta of each node writing it, half of each reading it
    (shared among the groups that node reads)."""
    total = 0.0
    for a in info.groups[group].activations:
        act = info.activations[a]
        nodes = [(act.producer, 1.0)] if act.producer is not None else []
        for node, _ in act.readers:
            reads = {info.group_of[r.name] for i in range(len(node.input))
                     if (r := info.read_activation(node, i)) is not None}
            nodes.append((node, 1.0 / max(1, len(reads))))
        for node, share in nodes:
            if node is not None:
                total += 0.5 * share * (c16.get(node.name, 0) - c8.get(node.name, 0))
    return int(round(total))


def _prefix(ok: Callable[[int], bool], lo: int, hi: int, shortest: bool) -> int | None:
    """Binary search over prefix lengths in [lo, hi] for the shortest (or longest) length with ok(k), assuming
    ok is monotonic (more int16: better; more int4: worse). None if no length in the range is ok."""
    if shortest:
        if not ok(hi):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _closest_to_float(measured: Mapping[int, Score]) -> int:
    """The prefix length whose plan measured closest to float (the fewest groups on a tie): where the budget is
    out of reach, a partial plan can measure worse than int8 itself (a group whose int16 range misses values
    the samples show, an int8 copy's second rounding), and the best the search saw is what it returns."""
    return max(measured, key=lambda k: (measured[k].snr_db, -k))


def tail_producers(info: QdqModel, host_ops: frozenset[str] | None) -> list[onnx.NodeProto]:
    """The nodes writing a quantised activation, last first, up to the first one the host cannot run in float
    (`host_ops`: the op types it can; None: any). A suffix of a topological order holds every reader of each of
    its nodes: a float tail reads the NPU's outputs and the NPU reads none of its."""
    writes = {a.producer.output[0] for a in info.activations.values() if a.producer is not None}
    nodes = []
    for node in reversed(info.model.graph.node):
        if not writes.intersection(node.output):
            continue
        if host_ops is not None and node.op_type not in host_ops:
            break
        nodes.append(node)
    return nodes


@dataclass(frozen=True)
class FloatTail:
    """The float-tail step's outcome: the plan with the shortest tail in float that meets the budget (None: none
    does), its score, and precision.json's record of the step."""

    plan: PrecisionPlan | None
    score: Score | None
    record: dict


def float_tail(info: QdqModel, base: PrecisionPlan, measure: Callable[[onnx.ModelProto], Score],
               model: Callable[[PrecisionPlan], onnx.ModelProto], budget: PrecisionBudget,
               host_ops: frozenset[str] | None) -> FloatTail:
    """Where no 16-bit plan reaches the budget (a log of a power spectrum: no integer grid holds its range): the
    shortest tail of the graph kept in float on the host, over `base`, that does (binary search over the tail's
    length: more float, closer to float)."""
    nodes = tail_producers(info, host_ops)

    def plan_of(j: int) -> PrecisionPlan:
        outs = {o for n in nodes[:j] for o in n.output}
        return PrecisionPlan(base.int16, base.int4, frozenset(a for a in info.activations if a in outs))

    scores: dict[int, Score] = {}

    def ok(j: int) -> bool:
        if j not in scores:
            scores[j] = measure(model(plan_of(j)))
        return scores[j].meets(budget)

    j = _prefix(ok, 1, len(nodes), shortest=True) if nodes else None
    chosen = [n.name or n.output[0] for n in nodes[:j]] if j is not None else []
    record = {"candidates": len(nodes), "met": j is not None, "layers": sorted(chosen),
              "measured": {str(k): scores[k].to_json() for k in sorted(scores)}}
    if j is None:
        return FloatTail(None, None, record)
    return FloatTail(plan_of(j), scores[j], record)


def _fewest_int16(info: QdqModel, found: FloatTail, promoted: list[str], measure: Callable[[onnx.ModelProto], Score],
                 model: Callable[[PrecisionPlan], onnx.ModelProto], budget: PrecisionBudget) -> FloatTail:
    """With the tail in float, the shortest prefix of the promoted groups (in step 3's order, those left on the
    NPU) that still meets the budget: the noise the 16 bits were fighting may have been the tail's (the
    melspectrogram's log power), and every int16 group left costs NPU cycles."""
    assert found.plan is not None and found.score is not None
    floats = found.plan.floats
    npu = [g for g in promoted if not set(info.groups[g].activations) <= floats]
    scores = {len(npu): found.score}

    def plan_of(k: int) -> PrecisionPlan:
        return PrecisionPlan(frozenset(npu[:k]), found.plan.int4, floats)

    def ok(k: int) -> bool:
        if k not in scores:
            scores[k] = measure(model(plan_of(k)))
        return scores[k].meets(budget)

    k = _prefix(ok, 0, len(npu), shortest=True)
    assert k is not None  # the whole prefix is the tail's own plan, which met
    record = {**found.record, "int16_groups": {"kept": k, "of": len(npu),
                                               "measured": {str(j): scores[j].to_json() for j in sorted(scores)}}}
    return FloatTail(plan_of(k), scores[k], record)


def search(base: onnx.ModelProto, float_model: onnx.ModelProto, arrays: Mapping[str, np.ndarray],
           families: Iterable[str], budget: PrecisionBudget, cost: CostFn,
           ranges: Mapping[str, tuple[float, float]] | None = None,
           host_ops: frozenset[str] | None = None) -> tuple[PrecisionPlan, dict]:
    """The plan chosen within `budget` and the record of the search (precision.json's `search`). `host_ops`: the
    op types the targets' host CPUs run in float (None: any), for `budget.host_float`."""
    families = tuple(families)
    info = QdqModel(base)
    constants = constants_of(info)
    measure = Measure(float_model, arrays)

    def model(plan: PrecisionPlan) -> onnx.ModelProto:
        return apply_plan(base, plan, families, ranges)

    groups = [g for g in info.groups if promotable(info, g, families, constants) is None]
    layers = sorted(info.layers)
    s8 = measure(base)
    all16 = PrecisionPlan(frozenset(groups))
    s16 = measure(model(all16)) if groups else s8
    costs8 = cost(base)
    costs16 = cost(model(all16)) if groups else costs8
    base_cycles = {t: max(1, c.npu_cycles) for t, c in costs8.items()}

    candidates: dict[str, Candidate] = {}
    for g in groups:
        s = measure(model(PrecisionPlan(frozenset(set(groups) - {g}))))
        cycles = {t: _group_cycles(info, g, costs8[t].node_cycles, costs16[t].node_cycles) for t in costs8}
        candidates[g] = Candidate(g, info.groups[g].layers, np.maximum(s.noise - s16.noise, 0.0),
                                  _db_between(s16, s), cycles)
    signal = np.maximum(measure.signal, 1e-30)

    def value(c: Candidate) -> float:
        slowdown = max((max(0, v) / base_cycles[t] for t, v in c.cycles.items()), default=0.0)
        return float(np.max(c.loss / signal)) / (slowdown + 1e-6)

    order = sorted(groups, key=lambda g: -value(candidates[g]))
    allowed = budget.max_slowdown - 1.0
    spent, limit = 0.0, len(order)
    for k, g in enumerate(order):  # the longest prefix the estimated slowdown allows
        spent += max((max(0, v) / base_cycles[t] for t, v in candidates[g].cycles.items()), default=0.0)
        if spent > allowed:
            limit = k
            break

    scores: dict[int, Score] = {}

    def promoted(k: int) -> PrecisionPlan:
        return PrecisionPlan(frozenset(order[:k]))

    def promoted_ok(k: int) -> bool:
        if k not in scores:
            scores[k] = measure(model(promoted(k)))
        return scores[k].meets(budget)

    k = _prefix(promoted_ok, 0, limit, shortest=True)
    met = k is not None
    if k is None:  # not met within the estimated slowdown: the closest to float of the plans measured, every
        # group among them if Vela's figure for that is within the slowdown (the per-group estimate sums the
        # conversions a partial plan adds: on mp_face_detection 30 of 52 groups cost more cycles than all 52)
        measured = {0: s8, **scores}
        if all(c.fits and c.npu_cycles <= budget.max_slowdown * base_cycles[t] for t, c in costs16.items()):
            measured[len(order)] = s16
        k = _closest_to_float(measured)
    plan = promoted(k)
    plan_score = scores.get(k) or (s8 if k == 0 else s16 if k == len(order) else measure(model(plan)))

    int4: list[Candidate] = []
    if budget.weights_int4 and layers and met:
        costs4 = cost(model(PrecisionPlan(plan.int16, frozenset(layers))))
        for name in layers:
            s = measure(model(PrecisionPlan(plan.int16, frozenset({name}))))
            node = info.layers[name].node.name
            cycles = {t: costs4[t].node_cycles.get(node, 0) - costs8[t].node_cycles.get(node, 0) for t in costs8}
            c = Candidate(name, [name], np.maximum(s.noise - plan_score.noise, 0.0), _db_between(plan_score, s),
                          cycles, bytes_saved=info.layers[name].weight_elements // 2)
            int4.append(c)
        order4 = sorted(int4, key=lambda c: -(c.bytes_saved + 1) / (float(np.max(c.loss / signal)) + 1e-12))
        scores4: dict[int, Score] = {}

        def demoted(m: int) -> PrecisionPlan:
            return PrecisionPlan(plan.int16, frozenset(c.name for c in order4[:m]))

        def demoted_ok(m: int) -> bool:
            if m not in scores4:
                scores4[m] = measure(model(demoted(m)))
            return scores4[m].meets(budget)

        m = _prefix(demoted_ok, 0, len(order4), shortest=False) or 0
        plan = demoted(m)
        plan_score = scores4.get(m) or plan_score

    final_costs = cost(model(plan))
    while plan.int16 and any(not c.fits or c.npu_cycles > budget.max_slowdown * base_cycles[t]
                             for t, c in final_costs.items()):
        # Vela's figure for the whole plan over the budget (the per-group estimate is only an estimate): drop
        # the last promotions, a quarter at a time
        k = len(plan.int16) - max(1, len(plan.int16) // 4)
        plan = PrecisionPlan(promoted(k).int16, plan.int4)
        plan_score, met = measure(model(plan)), False
        final_costs = cost(model(plan))
    if not met and plan_score.snr_db < s8.snr_db:  # trimmed below int8 itself: int8 is the best within reach
        plan, plan_score, final_costs = PrecisionPlan(frozenset()), s8, costs8
    tail = None
    if not met and budget.host_float:
        found = float_tail(info, plan, measure, model, budget, host_ops)
        tail = found.record
        if found.plan is not None and found.score is not None:
            found = _fewest_int16(info, found, [g for g in order if g in plan.int16], measure, model, budget)
            tail = found.record
            assert found.plan is not None
            costs = cost(model(found.plan))
            tail["within_slowdown"] = all(c.fits and c.npu_cycles <= budget.max_slowdown * base_cycles[t]
                                          for t, c in costs.items())
            if tail["within_slowdown"]:
                plan, plan_score, final_costs, met = found.plan, found.score, costs, True
    met = met and plan_score.meets(budget, margin_db=0.0)
    for c in candidates.values():
        c.chosen = c.name in plan.int16
    for c in int4:
        c.chosen = c.name in plan.int4
    record = {
        "met": met,
        "budget": budget.model_dump(),
        "int8": s8.to_json(), "int16": s16.to_json(), "chosen": plan_score.to_json(),
        # whether 16 bits everywhere reaches the accuracy at all (if not, the int8 weights are the limit)
        "int16_meets": s16.meets(budget, margin_db=0.0),
        "cycles": {t: {"int8": costs8[t].npu_cycles, "int16": costs16[t].npu_cycles,
                       "chosen": final_costs[t].npu_cycles} for t in costs8},
        "fits": {t: c.fits for t, c in final_costs.items()},
        "groups": [candidates[g].to_json("group") for g in order],
        "layers": [c.to_json("layer") for c in int4],
        **({"float_tail": tail} if tail is not None else {}),
        "measurements": measure.runs,
    }
    return plan, record
