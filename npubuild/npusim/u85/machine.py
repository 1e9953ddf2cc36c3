"""Run a U85 command stream: memory regions as for U55/U65, plus the LUT RAM, chaining buffers and the accumulator."""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim import NotModelled
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.memory import batch_memory, read_outputs
from npubuild.npusim.npu_op import OpResult, SimResult, sample_trace, traced
from npubuild.npusim.npz import RawModel
from npubuild.npusim.u85.conv import run_conv
from npubuild.npusim.u85.dma import run_dma
from npubuild.npusim.u85.elementwise import run_elementwise
from npubuild.npusim.u85.machine_state import Machine
from npubuild.npusim.u85.pool import run_pool
from npubuild.npusim.u85.registers import COMMANDS
from npubuild.npusim.u85.resize import run_resize

RUNNERS = {"CONV": run_conv, "DEPTHWISE": run_conv, "POOL": run_pool, "ELEMENTWISE": run_elementwise,
           "RESIZE": run_resize}


def run(model: RawModel, inputs: list[np.ndarray], keep_ofms: bool = True) -> SimResult:
    """Run the command stream on integer inputs (in the artifact's NHWC shapes); returns outputs and op trace."""
    return run_samples(model, [inputs], keep_ofms)[0]


def run_samples(model: RawModel, samples: list[list[np.ndarray]], keep_ofms: bool = True) -> list[SimResult]:
    """Run the command stream once over every sample (memory, LUT RAM, chaining buffers and accumulator with a
    leading sample axis); a result per sample, as `run` on it alone gives (every op computes each sample's
    values on their own: exact integer arithmetic, constants read alike for all)."""
    mem = batch_memory(model, samples)
    m = Machine(mem, int(model.accelerator.rsplit("-", 1)[1]), model.ncores)
    trace: list[OpResult] = []
    if not model.decoded:
        model.decoded.extend(decode(model.commands, model.path, COMMANDS))
    for cmd in model.decoded:
        if cmd.kind == "DMA_START":
            try:
                run_dma(m, cmd)
            except StageError as exc:
                raise type(exc)(f"DMA at command word {cmd.offset // 4}: {exc.message}") from None
            continue
        if cmd.kind == "BRANCH":
            raise NotModelled(f"NPU op #{len(trace)} BRANCH: control flow (IF/WHILE) is not modelled")
        traced(trace, cmd, lambda cmd=cmd: RUNNERS[cmd.kind](m, cmd), keep_ofms)
    return [SimResult(read_outputs(mem, model, row), sample_trace(trace, row, keep_ofms))
            for row in range(len(samples))]
