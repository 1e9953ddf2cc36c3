"""Run an artifact's command stream on the machine of its generation: U55/U65 (npusim.u55) or U85 (npusim.u85),
both over the shared memory model (npusim.memory)."""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import SimResult
from npubuild.npusim.npz import RawModel


def run(model: RawModel, inputs: list[np.ndarray], keep_ofms: bool = True) -> SimResult:
    """Run the command stream on integer inputs (in the artifact's NHWC shapes); returns outputs and op trace."""
    if model.generation == "u85":
        from npubuild.npusim.u85.machine import run as run_u85

        return run_u85(model, inputs, keep_ofms)
    from npubuild.npusim.u55.machine import run as run_u55

    return run_u55(model, inputs, keep_ofms)


def run_samples(model: RawModel, samples: list[list[np.ndarray]], keep_ofms: bool = True) -> list[SimResult]:
    """`run` on each sample, all of them in one pass over the command stream (memory with a leading sample
    axis): U55/U65's cost is Python per op, thousands of ops on some models; U85's the per-op numpy calls."""
    if model.generation == "u85":
        from npubuild.npusim.u85.machine import run_samples as run_u85

        return run_u85(model, samples, keep_ofms)
    from npubuild.npusim.u55.machine import run_samples as run_u55

    return run_u55(model, samples, keep_ofms)
