"""Run an artifact's command stream on the machine of its generation: U55/U65 (npusim.u55) or U85 (npusim.u85),
both over the shared memory model (npusim.memory)."""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import SimResult
from npubuild.npusim.npz import RawModel


def run(model: RawModel, inputs: list[np.ndarray], keep_ofms: bool = True) -> SimResult:
    """Run the command stream on integer inputs (in the artifact's NHWC shapes); returns outputs and op trace."""
    return run_samples(model, [inputs], keep_ofms)[0]


def run_samples(model: RawModel, samples: list[list[np.ndarray]], keep_ofms: bool = True) -> list[SimResult]:
    """`run` on each sample, all of them in one pass over the command stream (memory with a leading sample
    axis): U55/U65's cost is Python per op, thousands of ops on some models; U85's the per-op numpy calls."""
    if model.generation == "u85":
        from npubuild.npusim.u85.machine import run_samples as machine
    else:
        from npubuild.npusim.u55.machine import run_samples as machine
    with _one_blas_thread():
        return machine(model, samples, keep_ofms)


def _one_blas_thread():
    """The simulator's matrix products (a convolution's exact integer accumulation, npu_op.exact_matmul) on one
    BLAS thread: on the hundreds of mid-sized products of a run OpenBLAS's other threads cost more CPU than
    they save (yolov8n U85's 93 products: 2.77 CPU s on two threads, 0.59 on one; the whole npu-sim task
    13.2 -> 10.4 CPU s, and less wall time on a shared machine), for the same integers. Restored on exit
    (threadpoolctl: scikit-learn's dependency, declared in pyproject)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")
