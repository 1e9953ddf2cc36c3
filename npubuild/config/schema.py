"""The one schema: pydantic models for compile specs, target profiles and pipelines.

Field names here are part of the contract users and scripts rely on: add
fields freely, rename none. Every model forbids unknown keys so that a typo is
an error with a position, not a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from npubuild.config.accelerator import ACCELERATOR_NAMES
from npubuild.config.accelerator import Accelerator as ParsedAccelerator
from npubuild.config.metrics import GATES

Accelerator = Literal[ACCELERATOR_NAMES]  # type: ignore[valid-type]  # config/accelerator.py's table
ACCELERATORS: tuple[str, ...] = ACCELERATOR_NAMES  # every accelerator config Vela 5.2 accepts
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
Name = Annotated[str, Field(pattern=NAME_RE.pattern, max_length=80)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- targets


class MemoryPool(Strict):
    """One memory on an AXI port, as Vela's system config describes it."""

    kind: Literal["sram", "dram", "on_chip_flash", "off_chip_flash"]
    port: Literal["axi0", "axi1"]
    size_kib: float = Field(gt=0, description="Capacity available to the NPU, KiB")
    clock_scale: float = Field(gt=0, le=1, description="Memory clock relative to the NPU clock")
    burst_length: int = Field(ge=1, description="Bytes per burst")
    read_latency: int = Field(ge=0, description="Cycles")
    write_latency: int = Field(ge=0, description="Cycles")
    max_reads: int | None = Field(default=None, ge=1)
    max_writes: int | None = Field(default=None, ge=0)
    ports_used: int | None = Field(default=None, ge=1, le=4, description="U85 only: AXI ports used")


class Placement(Strict):
    """Which pool holds the read-only constants, the tensor arena and the fast cache."""

    constants: str
    arena: str
    cache: str
    arena_cache_kib: float | None = Field(
        default=None, gt=0, description="Size of the arena cache; defaults to the cache pool's size"
    )


class VelaOptions(Strict):
    """Vela settings a profile or a spec may set; extra flags come from a fixed list, never a shell."""

    optimise: Literal["Performance", "Size"] = "Performance"
    tensor_allocator: Literal["LinearAlloc", "Greedy", "HillClimb"] = "HillClimb"
    cascading: bool = True
    output_format: Literal["tflite", "raw"] = "tflite"
    extra_flags: list[
        Literal[
            "--disable-chaining",
            "--disable-fwd",
            "--disable-buffering",
            "--disable-ifm-reuse",
            "--force-symmetric-int-weights",
            "--separate-io-regions",
        ]
    ] = []


class VelaMirror(Strict):
    """The system config and memory mode of Vela's bundled vela.ini that a profile reproduces value for value.

    Declared by the shipped profiles; a test compiles through both and requires identical figures.
    """

    system_config: str
    memory_mode: str


class HostCpu(Strict):
    """The CPU beside the NPU, which runs the host partitions: a Cortex-M runs them in TensorFlow Lite Micro (TFLite
    builtin operators only: the deployable .tflite), a Cortex-A running Linux in onnxruntime (any ONNX operator)."""

    kind: Literal["cortex-m", "cortex-a"] = "cortex-m"
    cpu: str = Field(default="cortex-m55", description="e.g. cortex-m55, cortex-m85, cortex-a55")


class TargetProfile(Strict):
    """An accelerator plus the system it sits in: clock, memories and their use."""

    name: Name
    description: str = ""
    accelerator: Accelerator
    platform: str = Field(description="Corstone platform for the FVP, e.g. corstone-300")
    clock_mhz: float = Field(gt=0)
    pools: dict[Name, MemoryPool]
    placement: Placement
    vela: VelaOptions = VelaOptions()
    host: HostCpu = Field(default_factory=HostCpu, description="The CPU that runs host partitions")
    optimise: Literal["performance", "size"] | None = Field(
        default=None, description="What the build minimises: inference time (default) or SRAM and off-chip memory "
        "(Vela's --optimise Size, and npubuild's forms chosen by memory); a spec's optimise overrides it")
    mirrors: VelaMirror | None = Field(
        default=None, description="The Vela bundled system config + memory mode this profile reproduces"
    )

    @model_validator(mode="after")
    def _check_pools(self) -> TargetProfile:
        ports: dict[str, str] = {}
        for name, pool in self.pools.items():
            if pool.port in ports:
                raise ValueError(f"pools '{ports[pool.port]}' and '{name}' are both on {pool.port}")
            ports[pool.port] = name
        for role in ("constants", "arena", "cache"):
            pool_name = getattr(self.placement, role)
            if pool_name not in self.pools:
                raise ValueError(f"placement.{role} names pool '{pool_name}', which is not in pools")
        if ParsedAccelerator.parse(self.accelerator).facts.ports_used:
            return self
        if any(p.ports_used is not None for p in self.pools.values()):
            raise ValueError("ports_used applies to ethos-u85 only")
        return self


# --------------------------------------------------------------------------- pipelines


def _expect_model() -> type[BaseModel]:
    """Gates: each is checked after the build; one that falls short fails it (exit 1). Made from
    metrics.GATES, the one table of gate keys, their metrics and bounds."""
    fields = {g.key: (g.type | None, Field(default=None, description=g.description or None, **g.bounds))
              for g in GATES}
    model = create_model("Expect", __base__=Strict, __doc__=_expect_model.__doc__, **fields)
    model.__module__ = __name__
    return model


Expect = _expect_model()


class Pipeline(Strict):
    """A named list of graph passes run before lowering, the TOSA profile to lower to, and the gates every
    build through it gets unless its spec sets them (`expect:`; a spec's `null` turns one off)."""

    name: Name
    description: str = ""
    profile: Literal["int", "fp"] = "int"
    passes: list[str] = []
    expect: Expect = Field(default_factory=lambda: Expect(), description=(
        "Default gates: a spec's own `expect:` value for a key wins, `null` relaxes it. A default gate on a "
        "metric the build did not measure (verify.tosa off) is not evaluated"))
    warn_below_npu_offload: float | None = Field(
        default=None, ge=0, le=1, description="Warn, naming the nodes that cause it, when a build runs less than "
                                              "this fraction of its model's nodes on the NPU (null: never)")


# --------------------------------------------------------------------------- specs


class RandomCalibration(Strict):
    samples: int = Field(default=32, ge=1, le=100000)
    seed: int = 0
    low: float = -1.0
    high: float = 1.0


class Calibration(Strict):
    """Where calibration inputs come from: seeded random samples or an .npy file (N, *input_shape)."""

    random: RandomCalibration | None = None
    npy: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Calibration:
        if (self.random is None) == (self.npy is None):
            raise ValueError("give exactly one of 'random' or 'npy'")
        return self


class Evaluation(Strict):
    """A labelled evaluation set: top-1 accuracy of the float model and of the TOSA graph on it."""

    inputs: str = Field(description=".npy (N, *input_shape) or .npz per input, relative to the spec file")
    labels: str = Field(description=".npy of N integer class labels, relative to the spec file")
    output: str | None = Field(default=None, description="Graph output holding the class scores (default: first)")
    samples: int | None = Field(default=None, ge=1, description="Use only the first N samples")


EVAL_METRICS = ("top1", "top1_agreement", "mask_iou", "detection_agreement", "snr")
USER_METRIC_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


class Evaluate(Strict):
    """A task-level evaluation: real inputs through the float model and the graph each target deploys,
    compared by one metric (npubuild/verify/evaluate.py says what each computes)."""

    inputs: str = Field(description=".npy (N, *input_shape) or .npz per input, relative to the spec file")
    labels: str | None = Field(default=None, description=".npy of N labels (needed by top1), relative to the spec file")
    metric: str = Field(default="top1_agreement", max_length=200, description=(
        "top1 (accuracy on the labels), top1_agreement, mask_iou, detection_agreement, snr (dB), or "
        "module:function, a function(float_outputs, int8_outputs, labels) -> float in a .py file under the "
        "spec's directory (module a dotted path relative to it)"))
    output: str | None = Field(default=None, description="Graph output the metric reads (default: the first)")
    samples: int | None = Field(default=None, ge=1, le=100000, description="Use only the first N samples")
    threshold: float = Field(default=0.5, description="mask_iou: the mask's threshold; detection_agreement: the "
                             "model's own score threshold")
    boxes: str | None = Field(default=None, description="detection_agreement: the output holding each candidate's "
                              "box (last axis: 4 values, or more with the box first); without it, candidates agree "
                              "by position")
    box_format: Literal["cxcywh", "xyxy"] = "cxcywh"
    logits: bool = Field(default=False, description="detection_agreement: scores are logits (sigmoid before the threshold)")
    iou: float = Field(default=0.5, gt=0, le=1, description="detection_agreement: IoU for a match (and NMS)")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in EVAL_METRICS and not USER_METRIC_RE.match(metric):
            raise ValueError(f"unknown metric '{metric}': one of {', '.join(EVAL_METRICS)}, or module:function")
        return metric

    @model_validator(mode="after")
    def _labels_for_top1(self) -> Evaluate:
        if self.metric == "top1" and self.labels is None:
            raise ValueError("metric top1 needs labels")
        return self


class ModelSpec(Strict):
    path: str = Field(description="ONNX file, relative to the spec file")
    input_shapes: dict[str, list[Annotated[int, Field(ge=1)]]] = {}
    calibration: Calibration = Calibration(random=RandomCalibration())
    evaluation: Evaluation | None = Field(default=None, description="The older form of `evaluate: {metric: top1}`")
    evaluate: Evaluate | None = None
    feedback: dict[str, str] = Field(default={}, description=(
        "A recurrent state the application feeds back: output name -> the input it is given to at the next "
        "call (Silero VAD: {stateN: state}). The input is quantised on the output's grid, so the device copies "
        "the output's codes straight back: no requantisation and no second rounding per step"))

    @model_validator(mode="after")
    def _one_evaluation(self) -> ModelSpec:
        if self.evaluation is not None and self.evaluate is not None:
            raise ValueError("give either 'evaluate' or the older 'evaluation', not both")
        fed = list(self.feedback.values())
        if len(set(fed)) < len(fed):
            raise ValueError("feedback: an input is fed by two outputs")
        return self

    @property
    def evaluation_spec(self) -> Evaluate | None:
        """`evaluate:`, or the older `evaluation:` as the top1 evaluation it is."""
        if self.evaluation is not None:
            e = self.evaluation
            return Evaluate(inputs=e.inputs, labels=e.labels, metric="top1", output=e.output, samples=e.samples)
        return self.evaluate


class LayerPrecision(Strict):
    """One layer's precision over the model-wide setting: its output activation (and what shares its
    quantisation through data movement) in 16 bits, its weights in 4; or its output in float, the layer run on
    the host CPU (for what no integer grid holds: a log of a power spectrum)."""

    activations: Literal["int8", "int16", "float"] | None = None
    weights: Literal["int8", "int4"] | None = None


class PrecisionBudget(Strict):
    """What `precision: auto` must hold (frontend/precision/search.py): the accuracy to reach against the float
    model, at most this much slower than the int8 build on every target. The search promotes the layers whose
    16 bits buy the most accuracy per cycle until the accuracy is met, then demotes to 4-bit weights the layers
    whose weights cost the least accuracy per byte saved while it still is. With `host_float`, where no 16-bit
    plan reaches the accuracy, the shortest tail of the graph that does is kept in float on the host CPU."""

    min_snr_db: float | None = Field(default=None, description="Worst output's SNR against the float model, dB")
    min_top1_agreement: float | None = Field(default=None, ge=0, le=1,
                                             description="Classifier: share of samples whose top-1 is float's")
    max_slowdown: float = Field(default=2.0, ge=1.0, le=16.0, description="Inference time over the int8 build's, "
                                                                           "on every target")
    weights_int4: bool = Field(default=True, description="Also demote weights to int4 where the budget allows")
    host_float: bool = Field(default=False, description="Where 16 bits cannot reach the accuracy, keep the fewest "
                             "last layers in float on the host CPU (their time is not estimated)")

    @model_validator(mode="after")
    def _some_accuracy(self) -> PrecisionBudget:
        if self.min_snr_db is None and self.min_top1_agreement is None:
            raise ValueError("give min_snr_db or min_top1_agreement: what the search must reach")
        return self


PRECISION_KEYS = ("activations", "weights", "precision", "budget", "layers")


class Quantization(Strict):
    """How the float model is quantised. `auto` (the default of each) tries every activation range estimator,
    bias correction and cross-layer equalisation and keeps what measures closest to float on the calibration
    data (frontend/ptq/choose.py); a value fixes that choice.

    Precision (frontend/precision/): `activations: int16` makes every activation 16-bit (16x8) where the op has
    an int16 form on the build's NPU families, `weights: int4` every conv and fully connected layer's weights
    4-bit (8x4); `layers` sets single layers (ONNX node names, globs allowed); `precision: auto` chooses per
    layer by measurement within `budget`."""

    per_channel: bool = True
    method: Literal["auto", "minmax", "mean_minmax", "mse", "percentile", "entropy"] = "auto"
    bias_correction: Literal["auto"] | bool = "auto"
    equalization: Literal["auto"] | bool = "auto"
    symmetric_activations: bool = False
    activations: Literal["int8", "int16"] = "int8"
    weights: Literal["int8", "int4"] = "int8"
    precision: Literal["fixed", "auto"] = "fixed"
    budget: PrecisionBudget | None = None
    layers: dict[str, LayerPrecision] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _budget_for_auto(self) -> Quantization:
        if self.precision == "auto" and self.budget is None:
            raise ValueError("precision: auto needs a budget (min_snr_db or min_top1_agreement)")
        if self.precision == "auto" and any(lp.activations == "float" for lp in self.layers.values()):
            raise ValueError("layers kept in float (activations: float) are the spec's choice, not the search's: "
                             "give them with precision: fixed")
        return self

    def recipe(self) -> dict:
        """The int8 recipe (what the quantize stage does), without the precision settings: an int8 build's
        quantize key is what it was before precision existed."""
        return self.model_dump(exclude=set(PRECISION_KEYS))

    @property
    def mixed(self) -> bool:
        """Whether any precision other than 8x8 is asked for (a precision stage runs)."""
        return self.activations != "int8" or self.weights != "int8" or self.precision == "auto" or bool(self.layers)


class Verify(Strict):
    tosa: bool = True
    samples: int = Field(default=4, ge=1, le=1000)
    seed: int = 1
    fvp: Literal["auto", "required", "off"] = "auto"
    holdout: bool = Field(default=True, description=(
        "A model with a calibration file and no evaluation set: hold `samples` of its rows (at most a quarter) "
        "back from calibration and verify on them, so the figures against float are on unseen data "
        "(npubuild/frontend/samples.py); false: verify on calibration rows"))




class FvpOptions(Strict):
    """How to run a build on a Corstone FVP (see npubuild/stages/fvp.py for the runner protocol)."""

    runner: str | None = Field(default=None, description="Runner application ELF, relative to the spec file")
    executable: str | None = Field(default=None, description="FVP binary (path or name); default: the "
                                   "target platform's FVP on PATH")
    timeout_s: int = Field(default=300, ge=1, le=86400, description="FVP --timelimit, seconds")
    model_address: int = Field(default=0x90000000, ge=0, description="Where --data loads the Vela model")
    input_address: int = Field(default=0x92000000, ge=0, description="Where --data loads the input bytes")


class CompileSpec(Strict):
    version: Literal[1] = 1
    name: Name
    description: str = ""
    models: dict[Name, ModelSpec] = Field(min_length=1)
    targets: list[Name | TargetProfile] = Field(min_length=1)
    pipeline: Name | Pipeline = "default"
    quantization: Quantization = Quantization()
    verify: Verify = Verify()
    expect: Expect = Expect()
    fvp: FvpOptions = FvpOptions()
    vela: VelaOptions | None = Field(default=None, description="Overrides, field by field, the target profiles' Vela options")
    optimise: Literal["performance", "size"] | None = Field(
        default=None, description="What the builds minimise: inference time (default) or SRAM and off-chip memory "
        "(Vela's --optimise Size, and npubuild's forms chosen by memory); overrides the target profiles' optimise")
    search_paths: list[str] = Field(
        default=[], description="Extra directories (relative to this file) holding targets/ and pipelines/"
    )

    @field_validator("targets")
    @classmethod
    def _unique_targets(cls, targets: list) -> list:
        names = [t if isinstance(t, str) else t.name for t in targets]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"target listed twice: {', '.join(sorted(dup))}")
        return targets


EXTENDS_SCHEMA = {
    "description": "Parent file(s) (a .yaml path relative to this file) or, for targets and pipelines, profile "
                   "name(s), deep-merged under this one (later wins)",
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
}
SCHEMA_FILES = {"spec": "schema.json", "target": "target.schema.json", "pipeline": "pipeline.schema.json"}


def _partial(node, defs: dict):
    """A copy of a JSON Schema node with nothing required and every $ref to a `<Name>Partial` copy: the shape
    of a file that extends another, whose missing keys come from its parent (nested mappings merge deeply)."""
    if isinstance(node, list):
        return [_partial(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "required":
            continue
        if k == "$ref" and isinstance(v, str) and v.startswith("#/$defs/"):
            name = v.rsplit("/", 1)[1]
            out[k] = f"#/$defs/{name}Partial"
            continue
        out[k] = _partial(v, defs)
    return out


def _with_partials(schema: dict) -> dict:
    """Add `<Name>Partial` for every $def (and for the top level, as `<title>Partial`)."""
    defs = schema.setdefault("$defs", {})
    for name, d in list(defs.items()):
        defs[f"{name}Partial"] = _partial(d, defs)
    return schema


def _top(model: type[BaseModel], title: str) -> dict:
    """`model`'s schema with its own definition moved under $defs, so the top level can combine branches."""
    schema = model.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})
    defs[model.__name__] = schema
    return _with_partials({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, "$defs": defs})


def _allow_extends(d: dict) -> dict:
    d = dict(d)
    d["properties"] = {**d.get("properties", {}), "extends": EXTENDS_SCHEMA}
    return d


def json_schema(kind: str = "spec") -> dict:
    """JSON Schema for editors (yaml-language-server): `spec` (compile specs), `target` or `pipeline` files.

    It accepts what the loader accepts: a spec or an inline target with `extends:` may leave out what its
    parent gives (each key still checked: types, names, no unknown keys); a target or pipeline file may be a
    partial parent (targets/base/*.yaml) and its name defaults to the file's."""
    if kind == "target":
        schema = _top(TargetProfile, "npubuild target profile")
        schema.update(_allow_extends(schema["$defs"]["TargetProfilePartial"]))
        return schema
    if kind == "pipeline":
        schema = _top(Pipeline, "npubuild pipeline")
        schema.update(_allow_extends(schema["$defs"]["PipelinePartial"]))
        return schema
    if kind != "spec":
        raise ValueError(f"no schema for '{kind}' (known: {', '.join(SCHEMA_FILES)})")
    schema = _top(CompileSpec, "npubuild compile spec")
    defs = schema["$defs"]
    inline_override = {**_allow_extends(defs["TargetProfilePartial"]), "required": ["extends"],
                       "description": "An inline target extending a named profile: only what differs"}
    defs["TargetOverride"] = inline_override
    for name in ("CompileSpec", "CompileSpecPartial"):
        items = defs[name]["properties"]["targets"]["items"]
        items["anyOf"] = [*items["anyOf"], {"$ref": "#/$defs/TargetOverride"}]
    defs["CompileSpecExtending"] = {**_allow_extends(defs["CompileSpecPartial"]), "required": ["extends"]}
    schema["anyOf"] = [{"$ref": "#/$defs/CompileSpec"}, {"$ref": "#/$defs/CompileSpecExtending"}]
    return schema


def write_schemas(directory) -> None:
    """schema.json, target.schema.json and pipeline.schema.json into `directory` (the build dir, where the
    example specs' `yaml-language-server: $schema=../build/schema.json` comments point), rewritten only
    when they change; not even computed (90 ms, on every no-op build) while they are newer than the modules
    they are made from."""
    import json
    import os
    from pathlib import Path

    from npubuild.config import accelerator, metrics
    from npubuild.fileio import write_text

    sources = max(Path(m.__file__).stat().st_mtime for m in (accelerator, metrics))
    sources = max(sources, Path(__file__).stat().st_mtime)
    for kind, name in SCHEMA_FILES.items():
        path = Path(directory) / name
        try:
            if path.stat().st_mtime >= sources:
                continue
        except OSError:
            pass
        text = json.dumps(json_schema(kind), indent=2) + "\n"
        try:
            if path.read_text() == text:
                os.utime(path)  # up to date with its sources: not computed again
                continue
        except OSError:
            pass
        write_text(path, text)
