"""Run an Ethos-U55/U65 command stream: DMA and one NPU op at a time in command-stream order, every sample of
a batch at once (memory with a leading sample axis): the Python per op, most of the time of a stream of
thousands of small ops, is paid once for all samples."""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim import NotModelled
from npubuild.npusim.cmdstream import Command, decode
from npubuild.npusim.memory import batch_memory, read_outputs, region_of
from npubuild.npusim.npu_op import OpResult, SimResult, sample_trace, traced
from npubuild.npusim.npz import RawModel
from npubuild.npusim.u55 import ops


def _dma(mem: dict, cmd: Command) -> None:
    r = cmd.regs
    src_reg, dst_reg = r.get("DMA0_SRC_REGION", 0), r.get("DMA0_DST_REGION", 0)
    src, dst = region_of(mem, src_reg), region_of(mem, dst_reg)
    if (src_reg >> 9) & 3 or (dst_reg >> 9) & 3:
        raise NotModelled("2D/3D DMA is not modelled yet")
    s, d, n = cmd.addr("DMA0_SRC"), cmd.addr("DMA0_DST"), cmd.addr("DMA0_LEN")
    if s + n > src.shape[-1] or d + n > dst.shape[-1]:
        raise StageError(f"DMA of {n} bytes outside its region")
    dst[..., d:d + n] = src[..., s:s + n]


def _run_op(mem: dict, cmd: Command, model: RawModel) -> OpResult:
    if cmd.kind in ("CONV", "DEPTHWISE"):
        return ops.run_conv(mem, cmd, model.accelerator, model.ncores)
    if cmd.kind == "POOL":
        return ops.run_pool(mem, cmd, model.ncores)
    return ops.run_elementwise(mem, cmd)


def run(model: RawModel, inputs: list[np.ndarray], keep_ofms: bool = True) -> SimResult:
    """Run an Ethos-U55/U65 command stream on integer inputs (in the artifact's NHWC shapes); returns outputs and
    op trace."""
    return run_samples(model, [inputs], keep_ofms)[0]


def run_samples(model: RawModel, samples: list[list[np.ndarray]], keep_ofms: bool = True) -> list[SimResult]:
    """Run the command stream once over every sample (each a list of integer inputs); a result per sample, as
    `run` on it alone gives (every op computes each sample's row on its own: exact integer arithmetic)."""
    mem = batch_memory(model, samples)
    trace: list[OpResult] = []
    if not model.decoded:
        model.decoded.extend(decode(model.commands, model.path))
    for cmd in model.decoded:
        if cmd.kind == "DMA_START":
            _dma(mem, cmd)
            continue
        traced(trace, cmd, lambda cmd=cmd: _run_op(mem, cmd, model), keep_ofms)
    return [SimResult(read_outputs(mem, model, row), sample_trace(trace, row, keep_ofms))
            for row in range(len(samples))]

