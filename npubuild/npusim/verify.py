"""Compare npu-sim on a compiled artifact with the TOSA reference model; localise the first differing NPU op."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.npu_op import OpResult
from npubuild.npusim.npz import RawModel
from npubuild.npusim.sim import run, run_samples
from npubuild.npusim.tosa_probe import GraphOp, graph_ops, intermediates
from npubuild.tosa.memo import RunMemo, graph_key


@dataclass
class Mismatch:
    """The first NPU op whose OFM equals no TOSA intermediate of its shape (those it could map to).

    `tosa_op` names the first TOSA operator whose result npu-sim does not reproduce while its inputs are
    reproduced (when the graph localises it): the NPU op is then the first one after those inputs' producers
    that writes a wrong value of that result's shape."""

    op: int  # position among NPU ops
    kind: str
    ofm_shape: tuple[int, int, int]
    ofm_format: str
    candidates: list[str]
    tosa_op: str | None = None

    def describe(self) -> str:
        head = f"NPU op #{self.op} {self.kind} (ofm {list(self.ofm_shape)} {self.ofm_format})"
        if self.tosa_op:
            return f"{head} differs from TOSA {self.tosa_op} (the first TOSA result npu-sim does not reproduce)"
        return f"{head} matches none of TOSA {', '.join(self.candidates[:4])}"


@dataclass
class Verdict:
    samples: int = 0
    mismatches: dict[str, int] = field(default_factory=dict)  # output -> differing elements over all samples
    elements: dict[str, int] = field(default_factory=dict)
    first_bad_sample: int | None = None
    first_bad_op: Mismatch | None = None
    sim_seconds: float = 0.0
    npu_ops: int = 0
    # npu-sim's outputs per sample (the artifact's, in TOSA layout): what the deployed command stream computed,
    # which the npu-sim stage measures against the float model without running it again
    outputs: list[list[np.ndarray]] = field(default_factory=list)
    reference_runs: int = 0  # reference-model runs made here (the rest were kept by tosa-check: tosa/memo.py)
    held_to_checked: int = 0  # samples held to the checked graph's kept outputs (compare's `checked`)
    # samples whose outputs differ from the checked graph's kept ones (compare's `checked`), in order: where
    # the compiled graph was found bit-identical to model.tosa, a claim these samples break
    off_checked: list[int] = field(default_factory=list)

    @property
    def bitexact(self) -> bool:
        return not any(self.mismatches.values())


def _maps_to(ofm: np.ndarray, tensor: np.ndarray) -> bool | None:
    """None if the TOSA tensor cannot hold this OFM (shape); else whether some channel window equals it.

    An op that kept its result in the accumulator (U85, output disabled) has no OFM to compare."""
    if ofm.ndim != 3:
        return None
    oh, ow, oc = ofm.shape
    if tensor.ndim < 1 or tensor.size % max(tensor.shape[-1], 1):
        return None
    c = tensor.shape[-1]
    if c < oc or tensor.size // c != oh * ow:
        return None
    t = tensor.reshape(oh, ow, c).astype(np.int64)
    return any(np.array_equal(t[..., c0:c0 + oc], ofm) for c0 in range(c - oc + 1))


def tensor_of(op: OpResult, inter: dict[str, np.ndarray]) -> str | None:
    """The TOSA tensor (same element width) holding this op's OFM, if any: maps NPU ops back to the graph."""
    same = [(n, t) for n, t in inter.items() if t.dtype.itemsize * 8 == op.ofm_bits]
    for exact in (True, False):  # a tensor of exactly the OFM's size first, then channel slices of larger ones
        for name, t in same:
            if (t.size == op.ofm.size) == exact and _maps_to(op.ofm, t):
                return name
    return None


def localise(trace: list[OpResult], inter: dict[str, np.ndarray], graph: list[GraphOp] | None = None
             ) -> Mismatch | None:
    """Through the graph first (`_graph_localise`); else the first 8/16-bit OFM matching no TOSA tensor.

    Only 8/16-bit OFMs are compared without the graph: 32-bit ones are mostly Vela's internal steps (a
    RESCALE split in two)."""
    found = _graph_localise(trace, inter, graph) if graph else None
    if found:
        return found
    for n, op in enumerate(trace):
        if op.ofm_bits > 16:
            continue
        cands = []
        for name, t in inter.items():
            if t.dtype.itemsize * 8 != op.ofm_bits:
                continue
            ok = _maps_to(op.ofm, t)
            if ok:
                cands = []
                break
            if ok is False:
                cands.append(name)
        if cands:
            return Mismatch(n, op.kind, op.ofm_shape, op.ofm_format, cands)
    return None


# ... unless an op maps many inputs to one result: CLZ of a slightly wrong softmax sum is still right, which
# blamed the first other reader of that sum (LOGICAL_LEFT_SHIFT) for a difference made before it
MANY_TO_ONE = frozenset({"CLZ", "ARGMAX", "EQUAL", "GREATER", "GREATER_EQUAL"})


def _reproduces(op: OpResult, t: np.ndarray) -> bool:
    """The OFM holds all of tensor `t`, element for element (a channel window may be a CONCAT's other input)."""
    return op.ofm.ndim == 3 and op.ofm.size == t.size and np.array_equal(op.ofm.ravel(), t.ravel())


def _differs(op: OpResult, t: np.ndarray) -> bool:
    """The OFM has the shape of `t` (its size, or a channel window of it) but not its values."""
    if op.ofm.ndim == 3 and op.ofm.size == t.size:
        return not _reproduces(op, t)
    return _maps_to(op.ofm, t) is False


def _graph_localise(trace: list[OpResult], inter: dict[str, np.ndarray], graph: list[GraphOp]) -> Mismatch | None:
    """Vela splits some TOSA ops into many NPU ops (a 6-D TRANSPOSE into thousands of strided copies) whose
    OFMs are pieces of no TOSA tensor, so "the first OFM matching nothing" is often a correct piece. Instead:
    a TOSA tensor is good if some NPU OFM reproduces it or one of its descendants; the first operator with
    good inputs and a result that is not good is where npu-sim and TOSA part, and the NPU op blamed is the
    first after its inputs' producers whose OFM has the shape of that result (or its descendants) but not
    its values."""
    first_hit: dict[str, int] = {}
    by_bits: dict[int, list[tuple[str, np.ndarray]]] = {}
    for name, t in inter.items():
        by_bits.setdefault(t.dtype.itemsize * 8, []).append((name, t))
    for n, op in enumerate(trace):
        for name, t in by_bits.get(op.ofm_bits, []):
            if name not in first_hit and _reproduces(op, t):
                first_hit[name] = n
    produced = {o for g in graph for o in g.outputs}
    good = set(first_hit)
    for g in reversed(graph):  # ancestors of a reproduced tensor computed it right ...
        if g.kind not in MANY_TO_ONE and any(o in good for o in g.outputs):
            good.update(i for i in g.inputs if i in produced)
    for k, g in enumerate(graph):
        if all(o in good for o in g.outputs) or not all(i in good or i not in produced for i in g.inputs):
            continue
        after = max((first_hit[i] for i in g.inputs if i in first_hit), default=-1)
        bad = [o for o in g.outputs if o not in good]
        frontier = set(bad)
        for later in graph[k + 1:]:
            if any(i in frontier for i in later.inputs):
                frontier.update(o for o in later.outputs if o not in good)
                bad.extend(o for o in later.outputs if o not in good)
        for n in range(after + 1, len(trace)):
            op = trace[n]
            for name in bad:
                t = inter.get(name)
                if t is not None and t.dtype.itemsize * 8 == op.ofm_bits and _differs(op, t):
                    return Mismatch(n, op.kind, op.ofm_shape, op.ofm_format, [name],
                                    f"{g.kind} -> {g.outputs[0]} {list(inter[g.outputs[0]].shape) if g.outputs[0] in inter else ''}".rstrip())
        return None
    return None


def compare(model: RawModel, tosa: bytes, samples: list[list[np.ndarray]], names: list[str],
            memo: RunMemo | None = None, checked: Sequence[list[np.ndarray] | None] | None = None) -> Verdict:
    """Run every sample (integer TOSA inputs) on both; on the first differing sample, find the op. `memo`: the
    TOSA runs an earlier stage made (tosa/memo.py), taken instead of made again.

    `checked`: per sample, the outputs of the graph tosa-check held to the QDQ model (model.tosa, of which
    `tosa` is the target's own form: bit-identical where the family's forms are exact, within the lower
    stage's error bound where it chose another form), as tosa-check kept them (it keeps its runs of
    model.tosa on every sample, of `tosa` on the first only), laid out as `tosa`'s outputs; None where not
    kept. A sample whose npu-sim outputs are those bit for bit is held to them (the deployable computes
    exactly what was checked), and `tosa` runs on the reference model only for a sample that differs from
    them, so a difference is still found and measured against the graph Vela compiled (selfie segmentation's
    U55/U65 global mean as a raw REDUCE_SUM against model.tosa's AVG_POOL2D gave one, 2 and 3 of 3 samples
    run, until plane_sum was kept to where it is exact: none now).

    npu-sim runs the samples together (npusim.sim.run_samples) without keeping every op's OFM: the first
    differing sample alone is run again with them, for `localise`."""
    import time

    v = Verdict(samples=len(samples))
    if len(model.outputs) != len(names) or len(model.inputs) != len(samples[0] if samples else []):
        raise StageError(f"the artifact has {len(model.inputs)} inputs / {len(model.outputs)} outputs, "
                         f"the TOSA graph {len(samples[0]) if samples else 0} / {len(names)}")
    kept = [kept_outputs(memo, tosa, xs) for xs in samples]
    by_checked = list(checked) if checked is not None else [None] * len(samples)
    t0 = time.perf_counter()
    results = run_samples(model, samples, keep_ofms=False) if samples else []
    v.sim_seconds = time.perf_counter() - t0
    for s, (xs, want, res) in enumerate(zip(samples, kept, results, strict=True)):
        on_checked = by_checked[s] is not None and _identical(by_checked[s], res.outputs)
        if by_checked[s] is not None and not on_checked:
            v.off_checked.append(s)
        if want is None and on_checked:
            want = by_checked[s]
            v.held_to_checked += 1
        if want is None:
            want = reference_outputs(tosa, xs)
            v.reference_runs += 1
        v.npu_ops = len(res.ops)
        v.outputs.append([np.asarray(g) for g in res.outputs])
        if _count_mismatches(v, names, want, res.outputs) and v.first_bad_sample is None:
            v.first_bad_sample = s
            v.first_bad_op = localise(run(model, xs).ops, intermediates(tosa, xs), graph_ops(tosa))
    return v


def kept_outputs(memo: RunMemo | None, tosa: bytes, xs: list[np.ndarray]) -> list[np.ndarray] | None:
    """The reference model's outputs of `tosa` on one sample where an earlier stage kept that very run (the
    same graph bytes and inputs), else None."""
    if memo is None:
        return None
    kept = memo.get(graph_key(tosa, [np.ascontiguousarray(x) for x in xs]))
    return None if kept is None else [kept[str(i)] for i in range(len(kept))]


def _identical(want: list[np.ndarray], got: list[np.ndarray]) -> bool:
    """Whether npu-sim's outputs are the reference's bit for bit: as many, each the same size and values."""
    return len(want) == len(got) and all(
        w.size == np.asarray(g).size and np.array_equal(w.astype(np.int64), np.asarray(g).reshape(w.shape).astype(np.int64))
        for w, g in zip(want, got, strict=True))


def reference_outputs(tosa: bytes, xs: list[np.ndarray], memo: RunMemo | None = None) -> list[np.ndarray]:
    """The TOSA reference model's outputs of the graph on one sample: from `memo` where an earlier stage made
    this very run (the same graph bytes and inputs), else run here."""
    import tosa_reference_model as trm

    from npubuild.tosa.run import _quiet_stdio

    kept = kept_outputs(memo, tosa, xs)
    if kept is not None:
        return kept
    with _quiet_stdio():
        want, status = trm.run(tosa, [np.ascontiguousarray(x) for x in xs])
    if "VALID" not in str(status):
        raise ValueError(f"TOSA reference model rejected the graph: {status}")
    return [np.asarray(w) for w in want]


def _count_mismatches(v: Verdict, names: list[str], want: list[np.ndarray], got: list[np.ndarray]) -> bool:
    """Add one sample's differing elements per output to the verdict; whether any differ."""
    bad_here = False
    for name, w, g in zip(names, want, got, strict=True):
        if w.size != g.size:
            raise StageError(f"output '{name}': the artifact writes {g.size} elements, TOSA {w.size} "
                             "(is part of the graph on the CPU?)")
        g = g.reshape(w.shape)
        bad = int(np.count_nonzero(w.astype(np.int64) != g.astype(np.int64)))
        v.mismatches[name] = v.mismatches.get(name, 0) + bad
        v.elements[name] = v.elements.get(name, 0) + w.size
        bad_here |= bad > 0
    return bad_here
