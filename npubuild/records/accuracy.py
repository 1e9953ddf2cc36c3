"""The TOSA check's measures of the deployed graph against the float model (verify/accuracy.py measures them):
per output (OutputAccuracy), per graph (FloatCheck, with the report's flat metrics) and per family (FloatChecks,
in numerics.json's `float_checks`). `collapsed` is decided here, from the stored figures, when a report reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

# Below 6 dB an int8 output's error is more than half the float output's amplitude (RMS): it no longer follows
# it. Healthy int8 outputs measure 20-45 dB (bench/numerics.md); on the real models (bench/real_models.md)
# the builds under 6 dB lose at the task level (orientation top-1, selfie IoU, hand landmarks), while BlazeFace's
# logits at 9 dB keep every detection: the gate is for collapse, `min_float_snr_db` and `evaluate:` for more.
# For a probability, a mean error within 1 LSB of its [0, 1] grid is the format's resolution, not a collapse.
COLLAPSE_SNR_DB = 6.0
COLLAPSE_MEAN_LSB = 1.0


@dataclass(frozen=True)
class OutputAccuracy:
    """One graph output of the deployed graph against the float model, over the held-back samples."""

    snr_db: float
    qdq_snr_db: float | None
    max_error_lsb: float | None  # None: the output is not quantized (a float or bool the host computes)
    mean_error_lsb: float | None
    probability: str | None  # "softmax", "sigmoid" (probability_outputs) or None
    top1_agreement: float | None = None
    mask_iou: float | None = None
    decision_agreement: float | None = None

    @property
    def collapsed(self) -> bool:
        """SNR under COLLAPSE_SNR_DB, unless the output is a probability whose error stays within its LSB (a
        map of faint probabilities: int8's 1/256 steps round them to 0 and nothing is decided differently).
        Only a probability's grid is known to be right: any other output's LSB is what calibration made it,
        and an outlier that blew its range up puts the whole signal under one LSB."""
        if self.snr_db >= COLLAPSE_SNR_DB:
            return False
        faint = self.probability is not None and self.mean_error_lsb is not None
        return not (faint and self.mean_error_lsb <= COLLAPSE_MEAN_LSB)

    def to_json(self) -> dict:
        return {**asdict(self), "collapsed": self.collapsed}


@dataclass(frozen=True)
class FloatCheck:
    """A deployed graph against the float model: per output, and the summary the report and the gates read."""

    outputs: Mapping[str, OutputAccuracy]
    samples: int
    samples_from: str  # frontend/samples.SampleSource.kind: where the samples came from

    def summary(self) -> dict:
        """The report's flat metrics (config/metrics.py): the worst output for each measure, None where no
        output has it."""
        outs = list(self.outputs.values())

        def worst(key: str, lowest: bool = True) -> float | None:
            vals = [getattr(o, key) for o in outs if getattr(o, key) is not None]
            return (min if lowest else max)(vals) if vals else None

        return {"float_snr_db": worst("snr_db"), "qdq_float_snr_db": worst("qdq_snr_db"),
                "float_max_error_lsb": worst("max_error_lsb", False),
                "float_mean_error_lsb": worst("mean_error_lsb", False),
                "float_top1_agreement": worst("top1_agreement"), "float_mask_iou": worst("mask_iou"),
                "float_decision_agreement": worst("decision_agreement"),
                "collapsed_outputs": sum(o.collapsed for o in outs),
                "float_samples": self.samples, "float_samples_from": self.samples_from}

    def to_json(self) -> dict:
        return {"samples": self.samples, "samples_from": self.samples_from,
                "outputs": {k: v.to_json() for k, v in self.outputs.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> FloatCheck:
        fields = OutputAccuracy.__dataclass_fields__
        return cls({k: OutputAccuracy(**{f: v[f] for f in fields if f in v}) for k, v in d["outputs"].items()},
                   d["samples"], d["samples_from"])


@dataclass(frozen=True)
class FloatChecks:
    """The TOSA check's measures against float: of the graph it checks (model.tosa, or a model's portable
    split) and of each family that deploys a graph of its own, measured on every sample (a family found
    bit-identical to model.tosa deploys model.tosa's outputs). `for_family` is what a target deploys."""

    graph: FloatCheck
    families: Mapping[str, FloatCheck]

    def for_family(self, family: str) -> FloatCheck:
        return self.families.get(family, self.graph)

    def to_json(self) -> dict:
        return {"graph": self.graph.to_json(), "families": {k: v.to_json() for k, v in self.families.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> FloatChecks:
        return cls(FloatCheck.from_json(d["graph"]), {k: FloatCheck.from_json(v) for k, v in d["families"].items()})
