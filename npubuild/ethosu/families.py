"""lower stage: run the pipeline's passes, lower the ONNX graph to TOSA 1.0, and partition it per NPU family.

model.tosa / io.json are the whole model in one TOSA graph (what the TOSA
check verifies and what a family that supports every node compiles). For an
INT build each lowering family the task's builds target (`families` in its config, some of U55, U65, U85,
U85-1024/2048: accelerator.LOWERING_FAMILIES; the others are not lowered) is lowered
with the forms it runs best (lowering/options.py) and written as
`<family>_model.tosa` where that differs from model.tosa; the support rules
of each family (U65 has U55's) place every node, a family that cannot run
some node gets its own partition files (`<family>_partN.tosa`,
`<family>_hostN.onnx`), and a partitioned or own-lowered model is run here
(NPU parts on the TOSA reference model, host parts on onnxruntime) against
the whole QDQ model on onnxruntime, on seeded random samples and on a few rows
of the spec's calibration file where it has one (real_feeds); an own whole graph of exact rewrites only
is compared with model.tosa bit for bit instead (same_as_whole).

A node no lowering takes (lowering/fallback.py) runs on the host on every family: there is then no
model.tosa, and the portable split (`partN.tosa`, `hostN.onnx`: only those nodes on the host) stands for
it in io.json (`portable`) and in the TOSA check; each family splits further by its support rules.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnx_ir as ir

from npubuild.config.accelerator import LOWERING_FAMILIES
from npubuild.errors import StageError
from npubuild.ethosu.measured import choose, vela_figures_all
from npubuild.ethosu.partition import PartitionPlan, plan_partitions, split_io, write_partitions
from npubuild.ethosu.vela_cache import VelaCache, for_stage_dir
from npubuild.fanout import fan_out
from npubuild.fileio import write_bytes
from npubuild.frontend.data import graph_inputs, integer_ranges, load_arrays
from npubuild.frontend.passes import run_passes
from npubuild.lowering.context import ModelArrays
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.fallback import HostNode, PartialLowering, lower_lowerable
from npubuild.lowering.options import LoweringOptions, Reads, recorded
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import FamilyRecord, LowerRecord, NodeRecord, PartitionRecord, Where
from npubuild.tosa.graph import ops_by_node, read_tosa, tensor_nodes
from npubuild.tosa.run import REFERENCE_MODEL_PER_ONNXRUNTIME, OnnxSession, timed_runs
from npubuild.verify.partitioned import PartitionedModel, worst_error

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
CHECK_SAMPLES = 4
REAL_CHECK_ROWS = 2  # calibration rows the tolerance check adds to its random samples (real_feeds)
MAX_PARTITION_LSB = 1.0


def node_tensors(lowered: LoweredGraph) -> dict[str, str]:
    """TOSA tensor -> ONNX node (empty if the ops cannot be lined up with the nodes)."""
    try:
        return tensor_nodes(ops_by_node(read_tosa(lowered.tosa), lowered.node_ops))
    except ValueError:
        return {}


def family_record(model: onnx.ModelProto, lowered: LoweredGraph, io: LowerRecord, plan: PartitionPlan, fam: str,
                  out_dir: Path, options: LoweringOptions | None = None) -> FamilyRecord:
    placements = tuple(plan.placements.values())
    if len(plan.partitions) == 1 and plan.partitions[0].kind == Where.NPU:
        parts = (io.whole_partition([p.node for p in placements]),)
    else:
        parts = tuple(write_partitions(model, plan, lowered.profile, out_dir, f"{fam}_", family=fam, options=options))
    return FamilyRecord(parts, placements)


def own_whole_graph(fam: str, fam_lowered: LoweredGraph, whole: PartitionRecord, out_dir: Path) -> PartitionRecord:
    """The family's own lowering of the whole model, written as <family>_model.tosa, in place of model.tosa."""
    file = f"{fam}_model.tosa"
    write_bytes(out_dir / file, fam_lowered.tosa)
    return replace(whole, file=file, inputs_io=tuple(fam_lowered.inputs), outputs_io=tuple(fam_lowered.outputs),
                   tensor_nodes=node_tensors(fam_lowered))


def _input_range(spec: IOSpec) -> tuple[float, float]:
    """The real range an int8 input can represent (the calibrated range), else [-1, 1]."""
    return spec.representable_range() or (-1.0, 1.0)


def check_feeds(io: LowerRecord, seed: int = 0,
                integers: Mapping[str, tuple[int, int]] | None = None) -> list[dict[str, np.ndarray]]:
    """The partition check's CHECK_SAMPLES inputs: seeded, uniform over each input's calibrated range; an
    integer or bool graph input (token ids, a mask) takes integers in `integers[name]` (frontend.data.integer_ranges)."""
    rng = np.random.default_rng(seed)
    integers = integers or {}

    def one(s: IOSpec) -> np.ndarray:
        if s.onnx_name in integers and not s.quantized:
            return rng.integers(*integers[s.onnx_name], size=s.onnx_shape, endpoint=True).astype(s.dtype)
        return rng.uniform(*_input_range(s), s.onnx_shape).astype(np.float32)

    return [{s.onnx_name: one(s) for s in io.inputs} for _ in range(CHECK_SAMPLES)]


def real_feeds(calibration: Path | None, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """REAL_CHECK_ROWS rows of the spec's calibration file, its first and last (none without a file; only those
    rows are read): real data reaches what uniform random inputs do not (flat regions make rounding ties: a
    whole plane's mean on one, issue 33, which no random sample made). Two rows bound the cost (2 reference-
    model runs per family checked, 4 with its baseline); on ppocr_cls_48x192's 24 rows its U85 graph is 0-5 LSB
    from the QDQ model, model.tosa's own error on every row (bench/tolerance_real.py --every-row)."""
    if calibration is None:
        return []
    arrays = load_arrays(calibration, model, rows=REAL_CHECK_ROWS)
    fed = {name: arrays[name] for name, _, _ in graph_inputs(model)}  # not a file's other arrays
    return [{k: v[i] for k, v in fed.items()} for i in range(min(v.shape[0] for v in fed.values()))]


def check_partitioned(qdq_path: Path, out_dir: Path, partitions: Sequence[PartitionRecord], io: LowerRecord,
                      seed: int = 0, integers: Mapping[str, tuple[int, int]] | None = None,
                      real: Sequence[dict[str, np.ndarray]] = ()) -> float | None:
    """Max error (output LSB) of the partitioned model against the whole QDQ model on onnxruntime, over the
    seeded samples (check_feeds) and the real rows `real` (real_feeds); None when the QDQ model itself refuses
    every sample (a graph input that is a shape, scales or a threshold, which uniform values make invalid:
    Resize's scales, Expand's shape): then nothing was compared here, and the TOSA check's comparison on the
    calibration data is the one that counts."""
    reference = OnnxSession(qdq_path)  # the QDQ model's own semantics, as the TOSA check compares against
    worst: float | None = None
    model = PartitionedModel(out_dir, partitions, io.outputs)
    for feeds in [*check_feeds(io, seed, integers), *real]:
        try:
            want = reference(feeds)
        except Exception:  # noqa: BLE001 - onnxruntime refusing synthetic values: this sample checks nothing
            continue
        worst = worst_error(model, feeds, want, worst or 0.0)
    return worst


@dataclass
class WholeGraphRun:
    """model.tosa's outputs on the first check sample and its error against the QDQ model there: run once
    per stage and compared with every family whose own lowering takes only exact rewrites."""

    outputs: dict[str, np.ndarray]
    max_error_lsb: float


def same_as_whole(whole: WholeGraphRun, own_outputs: dict[str, np.ndarray]) -> bool:
    """Whether the family's own whole graph gave model.tosa's outputs bit for bit on the first check sample.

    Why one sample is enough here: the family's options are exact rewrites (LoweringOptions.same_integers:
    the same integers for every input, each form tested so), so the only failure to catch is a form that is
    not, and any differing element of any output fails this; the tolerance check it replaces (4 samples)
    passed a family up to 1 LSB worse than model.tosa everywhere (MobileViT-xxs: model.tosa is 3-5 LSB from
    the QDQ model). It costs 2 TOSA reference-model runs instead of 4-8 (~3.4 s each for MobileViT-xxs)."""
    return all(np.array_equal(own_outputs[k], v) for k, v in whole.outputs.items())


def exact_forms_only(model: onnx.ModelProto, fam: str, fam_lowered: LoweredGraph,
                     options: LoweringOptions | None = None, lowerings: Lowerings | None = None) -> bool:
    """Whether the family's own graph is made of exact rewrites only: its options take no form that rounds
    differently, or lowering it without those forms gives the very same graph (they applied to no node: U85's
    int32 softmax to no row short enough). One lowering (~1 s for MobileViT-xxs; none when `lowerings`, the
    stage's, has made it already) that can spare the 4-8 TOSA reference-model runs of the tolerance check
    (~3.4 s each)."""
    options = options or LoweringOptions.for_family(fam)
    if options.same_integers:
        return True
    exact = options.exact_only()
    if lowerings is None:
        return lower_model(model, fam_lowered.profile, options=exact).tosa == fam_lowered.tosa
    return lowerings.whole(exact).tosa == fam_lowered.tosa


@dataclass
class Lowerings:
    """The stage's lowerings of its model, one per distinct LoweringOptions: the families and their measured
    variants often ask for the same options again (a choice's current form, the portable options, a family's
    exact-only forms), and a lowering of a large graph is ~1 s (palm detection: 12 lowerings a stage).
    Lowering is a function of the model, profile, options and known host nodes alone (lower_model's `family`
    only picks the options), so one made for one family serves every other."""

    model: onnx.ModelProto
    profile: Literal["int", "fp"]
    host: dict[str, HostNode]
    done: dict[LoweringOptions, PartialLowering] = field(default_factory=dict)
    # the option fields each lowering made here read, with their values: options that agree on all of them lower
    # to that graph too (palm detection: 2 of 12 lowerings, a measured choice that does not touch the model)
    # (and the answers of the predicates it asked: Reads.agree)
    reads: list[tuple[dict[str, object], Reads, PartialLowering]] = field(default_factory=list)
    # the model's initializers as read-only arrays, converted once for every lowering here
    arrays: ModelArrays | None = None

    def __post_init__(self) -> None:
        if self.arrays is None:
            self.arrays = ModelArrays.of(self.model)

    def portable(self) -> PartialLowering:
        """The portable lowering (model.tosa's), finding the host nodes every later lowering here cuts out, and
        kept with the option fields it read like any other: a measured variant that agrees with the portable
        options on those is that graph, not lowered again."""
        low = self(LoweringOptions.for_family(None))
        self.host = dict(low.host)
        return low

    def __call__(self, options: LoweringOptions) -> PartialLowering:
        """The model lowered with `options`, its host nodes cut out (lower_lowerable)."""
        if options not in self.done:
            self.done[options] = self._same_as_made(options) or self._lower(options)
        return self.done[options]

    def _same_as_made(self, options: LoweringOptions) -> PartialLowering | None:
        """A lowering made here that observed of its options what it would of `options` (Reads.agree)."""
        return next((low for values, read, low in self.reads if read.agree(values, options)), None)

    def _lower(self, options: LoweringOptions) -> PartialLowering:
        watched, names = recorded(options)
        low = lower_lowerable(self.model, self.profile, options=watched, host=self.host, arrays=self.arrays)
        self.reads.append(({name: getattr(options, name) for name in names}, names, low))
        return low

    def whole(self, options: LoweringOptions) -> LoweredGraph:
        """The whole model lowered with `options` (lower_model: its errors raised, none cut to the host), for a
        model with no host nodes: a whole lowering made here that read of its options what these have (a
        family's exact-only forms often are the options a measured choice lowered: palm detection, one of 11
        lowerings) is that graph, not lowered again; one made here is kept with what it read, for later options."""
        got = self.done.get(options) or self._same_as_made(options)
        if got is not None and got.whole:
            assert got.lowered is not None
            return got.lowered
        watched, names = recorded(options)
        lowered = lower_model(self.model, self.profile, options=watched, arrays=self.arrays)
        low = PartialLowering(lowered, {})
        self.done[options] = low
        self.reads.append(({name: getattr(options, name) for name in names}, names, low))  # for later options too
        return lowered


def lower_stage(src: Path, passes: Sequence[str], profile: Literal["int", "fp"], families: Sequence[str],
                io_path: Path, optimise: str = "performance", calibration: Path | None = None) -> dict:
    """The lower stage's work: the model through the pipeline's passes, lowered (lower_families) into the
    directory of `io_path`, and io.json written there; its metrics. `calibration`: the spec's calibration file,
    a few rows of which the families' tolerance check runs too (real_feeds)."""
    model = onnx.load(str(src))
    ir_model = run_passes(ir.serde.deserialize_model(model), list(passes))
    model = ir.serde.serialize_model(ir_model)
    choices: dict[str, list[dict]] = {}
    io, tosa_ops = lower_families(model, profile, io_path.parent, families, choices, optimise, calibration,
                                  for_stage_dir(io_path.parent))
    io.write(io_path)
    families = io.families
    compute_nodes = [n for n in model.graph.node if n.op_type not in QDQ_OPS]
    metrics = {"onnx_nodes": len(compute_nodes), "tosa_ops": tosa_ops, "tosa_op_count": sum(tosa_ops.values()),
               "transposes": tosa_ops.get("TRANSPOSE", 0),
               "partitioning": {f: {"npu_partitions": r.npu_partitions, "host_partitions": r.host_partitions,
                                    "host_ops": r.host_ops} for f, r in families.items()},
               "measured_choices": {f: c for f, c in choices.items() if c}}
    if io.portable is not None:
        metrics["host_nodes"] = [p.to_json() for p in io.portable.placements if p.kind == Where.HOST]
    return metrics


def lower_families(model: onnx.ModelProto, profile: Literal["int", "fp"], out_dir: Path,
                   families: Sequence[str] = LOWERING_FAMILIES,
                   choices: dict[str, list[dict]] | None = None,
                   optimise: str = "performance",
                   calibration: Path | None = None,
                   vela_cache: VelaCache | None = None) -> tuple[LowerRecord, dict[str, int]]:
    """The lower stage's work on a model already through the pipeline's passes: model.tosa (when one TOSA
    graph runs the whole model) or the portable split, and for an INT model each family's split, all
    written to `out_dir`. Returns io.json's record (with the families) and the count of each TOSA op.
    `optimise` "size": the families' measured choices go by SRAM and off-chip memory (ethosu/measured.py).
    `calibration`: the spec's calibration file, whose real rows the tolerance check runs too (real_feeds).
    `vela_cache`: the build dir's Vela cache, which keeps the measured choices' compiles for the vela stage."""
    lowerings = Lowerings(model, profile, {})
    partial = lowerings.portable()
    lowered = partial.lowered
    node_ops = lowered.node_ops if lowered is not None else {}
    tosa_ops: dict[str, int] = {}
    for ops in node_ops.values():
        for op in ops:
            tosa_ops[op] = tosa_ops.get(op, 0) + 1
    nodes = tuple(NodeRecord(n.name, n.op_type, tuple(node_ops.get(n.name, []))) for n in model.graph.node
                  if n.op_type not in QDQ_OPS)
    tosa_path = out_dir / "model.tosa"
    if partial.whole:
        assert lowered is not None
        write_bytes(tosa_path, lowered.tosa)
        io = LowerRecord(lowered.profile, tuple(lowered.inputs), tuple(lowered.outputs), nodes, node_tensors(lowered))
    else:  # no single TOSA graph: the portable split (only the nodes with no lowering on the host) stands for it
        tosa_path.unlink(missing_ok=True)
        io = portable_record(model, partial, profile, out_dir, nodes)
    records: dict[str, FamilyRecord] = {}
    if profile == "int":
        qdq_path = out_dir / "model_partitioning.onnx"
        # model.tosa's (or the portable split's) own runs: measured once, for every family
        cache = CheckCache(integers=integer_ranges(model), optimise=optimise, calibration=calibration,
                           vela=vela_cache)
        for fam in families:
            records[fam] = family_split(model, partial, io, fam, out_dir, qdq_path, cache, lowerings)
        if choices is not None:  # what ethosu/measured.py measured, for the stage's metrics
            choices.update(cache.choices)
    return replace(io, families=records), tosa_ops


@dataclass
class CheckCache:
    """What the partition check measured of the portable graph, kept for the families after the first."""

    baseline_error: dict[str, float] = field(default_factory=dict)  # "whole" / "portable" -> its own error
    integers: dict[str, tuple[int, int]] = field(default_factory=dict)  # integer inputs' values (check_feeds)
    choices: dict[str, list[dict]] = field(default_factory=dict)  # per family: what ethosu/measured.py measured
    optimise: str = "performance"  # what the measured choices minimise
    whole: WholeGraphRun | None = None
    calibration: Path | None = None  # the spec's calibration file: real rows for the tolerance check
    vela: VelaCache | None = None  # the build dir's Vela cache, for the measured choices' compiles
    _real: list[dict[str, np.ndarray]] | None = field(default=None, repr=False)

    def real(self, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
        """The calibration file's rows the tolerance check runs (real_feeds), read when a family first needs
        them: a build whose families all run model.tosa, or match it bit for bit, reads none."""
        if self._real is None:
            self._real = real_feeds(self.calibration, model)
        return self._real

    def with_own_run(self, qdq_path: Path, out_dir: Path, io: LowerRecord,
                     own: PartitionRecord) -> tuple[WholeGraphRun, dict[str, np.ndarray]]:
        """model.tosa's run (measured once) and the family's own whole graph's outputs on the first check
        sample: what same_as_whole compares. The first time both graphs are run at once on two workers
        (npubuild/fanout.py) when onnxruntime's time on the sample says the reference model's is worth it."""
        feeds = check_feeds(io, integers=self.integers)[0]
        own_model = PartitionedModel(out_dir, [own], io.outputs)
        if self.whole is not None:
            return self.whole, own_model(feeds)
        (ref,), onnxruntime_s = timed_runs(OnnxSession(qdq_path), [feeds])
        expected_s = 2 * REFERENCE_MODEL_PER_ONNXRUNTIME * onnxruntime_s
        whole_model = PartitionedModel(out_dir, [io.whole_partition([])], io.outputs)
        models = (whole_model, own_model)  # model.tosa first: its error, if any, is raised as it was before
        whole_outputs, own_outputs = fan_out(lambda i: models[i](feeds), 2, expected_s)
        self.whole = WholeGraphRun(whole_outputs, worst_error(whole_model, feeds, ref, 0.0, whole_outputs))
        return self.whole, own_outputs


def family_split(model: onnx.ModelProto, partial: PartialLowering, io: LowerRecord, fam: str, out_dir: Path,
                 qdq_path: Path, cache: CheckCache | None = None, lowerings: Lowerings | None = None) -> FamilyRecord:
    """One family's own lowering, placement and partitions, checked when it does not run model.tosa as it is:
    a whole graph of exact rewrites bit for bit against model.tosa (same_as_whole), else against the whole
    QDQ model within the portable graph's own error + MAX_PARTITION_LSB, on random samples and the calibration
    file's real rows (check_partitioned). `cache` keeps model.tosa's runs
    (TOSA reference-model runs; MobileViT-xxs: 3.4 s each) for the next family that needs them, `lowerings`
    the stage's lowerings (Lowerings) for every family."""
    cache = cache if cache is not None else CheckCache()
    profile = io.profile
    lower = lowerings if lowerings is not None else Lowerings(model, profile, partial.host)

    # the family's forms, with the choices a measurement decides for this model (ethosu/measured.py); each graph
    # compiled under the name the vela stage gives it (records/vela.vela_stem): model.tosa's graph as `model`, the
    # family's own whole graph as `<family>_model` (own_whole_graph)
    whole_tosa = partial.lowered.tosa if partial.lowered is not None else None
    measure = functools.partial(vela_figures_all, cache=cache.vela,
                                stem=lambda t: "model" if t == whole_tosa else f"{fam}_model")
    options, measured = choose(model, fam, lambda o: lower(o).lowered if lower(o).whole else None, measure,
                               optimise=cache.optimise) \
        if profile == "int" and partial.whole else (LoweringOptions.for_family(fam), [])
    cache.choices[fam] = measured
    fam_partial = lower(options)  # forms only this family runs
    lowered, fam_lowered = partial.lowered, fam_partial.lowered
    if partial.whole and fam_partial.whole:
        assert lowered is not None and fam_lowered is not None
        own = fam_lowered.tosa != lowered.tosa
        plan = plan_partitions(model, fam_lowered if own else lowered, fam)
        rec = family_record(model, fam_lowered if own else lowered, io, plan, fam, out_dir, options)
        if own and len(rec.partitions) == 1 and rec.partitions[0].file == "model.tosa":
            rec = replace(rec, partitions=(own_whole_graph(fam, fam_lowered, rec.partitions[0], out_dir),))
        if len(rec.partitions) < 2 and not own:
            return rec
        if own and rec.whole_graph and exact_forms_only(model, fam, fam_lowered, options, lower):
            if not qdq_path.exists():
                onnx.save(model, qdq_path)
            whole, own_outputs = cache.with_own_run(qdq_path, out_dir, io, rec.partitions[0])
            if same_as_whole(whole, own_outputs):
                return replace(rec, max_error_lsb=whole.max_error_lsb, same_as_model_tosa=True)
        # held to model.tosa's own error + MAX_PARTITION_LSB: a family's own lowering rounds differently, and a
        # split of model.tosa's lowering runs its integers on the NPU, so whatever model.tosa is off the QDQ
        # model (tosa-check's figure, gated there) is no fault of the split's
        baseline = [io.whole_partition([])]
    else:
        plan = plan_partitions(model, fam_lowered, fam, fam_partial.host)
        parts = write_partitions(model, plan, profile, out_dir, f"{fam}_", family=fam, options=options)
        rec = FamilyRecord(tuple(parts), tuple(plan.placements.values()))
        baseline = list(io.portable.partitions) if io.portable is not None else None
    if not qdq_path.exists():
        onnx.save(model, qdq_path)
    real = cache.real(model)
    err = check_partitioned(qdq_path, out_dir, rec.partitions, io, integers=cache.integers, real=real)
    rec = replace(rec, max_error_lsb=err)
    if err is not None and err > MAX_PARTITION_LSB:
        key = "whole" if partial.whole else "portable"
        if baseline and key not in cache.baseline_error:
            cache.baseline_error[key] = check_partitioned(qdq_path, out_dir, baseline, io, integers=cache.integers,
                                                          real=real)
        base = (cache.baseline_error.get(key) or 0.0) if baseline else 0.0
        if err > base + MAX_PARTITION_LSB:
            raise StageError(f"the {fam} partitioned model differs from the whole model by {err:g} LSB")
    return rec


def portable_record(model: onnx.ModelProto, partial: PartialLowering, profile: Literal["int", "fp"], out_dir: Path,
                    nodes: tuple[NodeRecord, ...]) -> LowerRecord:
    """io.json's record when no single TOSA graph exists: the portable split (partN.tosa, hostN.onnx: the nodes
    with no lowering on the host, everything else on the NPU, no family's support rules) and the io of the
    model it makes up, each graph input and output as the partition that reads or writes it sees it."""
    plan = plan_partitions(model, partial.lowered, None, partial.host)
    parts = tuple(write_partitions(model, plan, profile, out_dir, "", family=None))
    portable = FamilyRecord(parts, tuple(plan.placements.values()))
    inputs, outputs = split_io(model, parts)
    return LowerRecord(profile, inputs, outputs, nodes, {}, portable=portable)
