"""Which samples verify a build: tosa-check and npu-sim draw theirs through `SampleSource.verification`, so
that the artifact npu-sim runs sees the inputs the TOSA check measured.

From the calibration file where the spec gives one (a seeded choice of `verify.samples` rows), else seeded
random samples in the random calibration's range, with another seed than calibration's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # planning imports this module: numpy and onnx only where a stage reads data
    import numpy as np
    import onnx


@dataclass(frozen=True)
class SampleSource:
    """How many verification samples a build draws, and their seed (the spec's `verify.samples`, `.seed`)."""

    samples: int
    seed: int

    def verification(self, model: onnx.ModelProto, calibration: dict,
                     calibration_npy: Path | None) -> dict[str, np.ndarray]:
        """The verification samples of `model`'s inputs (`calibration`: the model's calibration settings)."""
        from npubuild.frontend.data import sample_arrays

        return sample_arrays(model, calibration, calibration_npy, self.samples, self.seed)
