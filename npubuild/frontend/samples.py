"""Which samples verify a build and which calibrate it: never the same ones, when the spec gives real data.

A build is measured against the float model (verify/accuracy.py) on its verification samples. Measured on
the samples that set the int8 ranges, an int8 model looks better than it is (MinMax clips nothing it was
calibrated on), so the samples come from, in this order:

1. `evaluation`: the model's evaluation set (`evaluate:`/`evaluation:` inputs), held out by its author;
2. `held-back`: a calibration file without one: `verify.samples` of its rows (at most a quarter of them,
   seeded by `verify.seed`) are held back, and the quantize stage calibrates on the others. The spec gives
   one data file and gets an honest figure without a second one; a calibration set of hundreds loses a
   handful of samples, one of 24 (the real models') keeps 20;
3. `random`: random calibration: seeded samples in its range, another seed than calibration's (as before);
4. `calibration`: a calibration file with `verify.holdout: false`, or fewer than 4 rows: its own rows (the
   report's `float_samples_from` says so, so nobody reads it as held-out accuracy).

The plan decides the kind once per model (`SampleSource.of`) and passes it in the configs of the quantize
stage (which rows calibrate) and of the stages that verify (which rows they run), so they always agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # planning imports this module: numpy and onnx only where a stage reads data
    import numpy as np
    import onnx

    from npubuild.config.load import Build

Kind = Literal["evaluation", "held-back", "random", "calibration"]
MIN_CALIBRATION_FRACTION = 4  # hold back at most 1/4 of a calibration file


@dataclass(frozen=True)
class SampleSource:
    """Where one model's verification samples come from (module docstring), and how many."""

    kind: Kind
    samples: int
    seed: int

    @classmethod
    def of(cls, b: Build) -> SampleSource:
        v = b.spec.verify
        if b.evaluation_inputs is not None:
            kind: Kind = "evaluation"
        elif b.calibration_npy is None:
            kind = "random"
        elif v.holdout and v.tosa:
            kind = "held-back"
        else:
            kind = "calibration"
        return cls(kind, v.samples, v.seed)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SampleSource:
        return cls(d["kind"], d["samples"], d["seed"])

    def held_back(self, n: int) -> np.ndarray:
        """The rows of an n-row calibration file held back from calibration (sorted; empty unless held-back)."""
        import numpy as np

        k = min(self.samples, n // MIN_CALIBRATION_FRACTION) if self.kind == "held-back" else 0
        if k == 0:
            return np.zeros(0, int)
        return np.sort(np.random.default_rng(self.seed).choice(n, size=k, replace=False))

    def calibration_rows(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A calibration file's rows the quantiser uses: all but the held-back ones."""
        import numpy as np

        n = next(iter(arrays.values())).shape[0]
        held = self.held_back(n)
        if not held.size:
            return arrays
        keep = np.setdiff1d(np.arange(n), held)
        return {k: v[keep] for k, v in arrays.items()}

    def verification(self, model: onnx.ModelProto, calibration: dict, calibration_npy: Path | None,
                     evaluation_npy: Path | None) -> tuple[dict[str, np.ndarray], Kind]:
        """The verification samples and the kind they really are (`held-back` from a file of fewer than 4
        rows is `calibration`)."""
        from npubuild.frontend.data import load_arrays, random_arrays, sample_arrays, subset

        if self.kind == "evaluation" and evaluation_npy is not None:
            return subset(load_arrays(evaluation_npy, model), self.samples, self.seed), "evaluation"
        if self.kind == "held-back" and calibration_npy is not None:
            arrays = load_arrays(calibration_npy, model)
            held = self.held_back(next(iter(arrays.values())).shape[0])
            if held.size:
                return {k: v[held] for k, v in arrays.items()}, "held-back"
        if calibration_npy is None:
            r = calibration["random"]
            return random_arrays(model, self.samples, self.seed + 1_000_003, r["low"], r["high"]), "random"
        return sample_arrays(model, calibration, calibration_npy, self.samples, self.seed), "calibration"
