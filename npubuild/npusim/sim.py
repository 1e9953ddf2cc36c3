"""The machine: memory regions, DMA, and one NPU op at a time in command-stream order.

`run` is the entry point for every generation: a U85 artifact goes to npusim.u85.machine, which
shares the memory set-up and the I/O helpers here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.errors import InputError, StageError
from npubuild.npusim import NotModelled, ops
from npubuild.npusim.cmdstream import Command, decode
from npubuild.npusim.npz import RawModel, TensorPlace

INTERNAL = "internal"  # key of the NPU's internal memory (SHRAM: LUTs) in the region map


class Memory(dict):
    """Region index (or INTERNAL) -> bytes; a region the artifact does not define is a one-line error."""

    def __missing__(self, key):
        raise StageError(f"the command stream uses region {key}, which the artifact does not define")


@dataclass
class SimResult:
    outputs: list[np.ndarray]
    ops: list[ops.OpResult] = field(default_factory=list)


def region_memory(model: RawModel) -> Memory:
    """Every region the artifact defines (weights, scratch, fast scratch, separate I/O), zeroed."""
    mem = Memory()
    weights = np.frombuffer(model.weights, np.uint8).copy()
    mem[model.weight_region] = weights
    mem[model.scratch_region] = np.zeros(max(model.scratch_size, 1), np.uint8)
    if model.fast_size > 0 and model.fast_region not in mem:
        mem[model.fast_region] = np.zeros(model.fast_size, np.uint8)
    mem[INTERNAL] = np.zeros(model.shram_kib * 1024, np.uint8)
    for place in (*model.inputs, *model.outputs):  # --separate-io-regions: I/O in regions of their own
        need = place.offset + place.nbytes
        if place.region not in mem:
            mem[place.region] = np.zeros(need, np.uint8)
        elif len(mem[place.region]) < need and place.region != model.weight_region:
            mem[place.region] = np.concatenate([mem[place.region], np.zeros(need - len(mem[place.region]), np.uint8)])
    return mem


def _region(mem: dict, reg: int) -> np.ndarray:
    """A DMA end: bit 8 selects the internal memory, else the low byte is the region index."""
    return mem[INTERNAL if reg >> 8 & 1 else reg & 0xFF]


def _dma(mem: dict, cmd: Command) -> None:
    r = cmd.regs
    src_reg, dst_reg = r.get("DMA0_SRC_REGION", 0), r.get("DMA0_DST_REGION", 0)
    src, dst = _region(mem, src_reg), _region(mem, dst_reg)
    if (src_reg >> 9) & 3 or (dst_reg >> 9) & 3:
        raise NotModelled("2D/3D DMA is not modelled yet")
    s, d, n = cmd.addr("DMA0_SRC"), cmd.addr("DMA0_DST"), cmd.addr("DMA0_LEN")
    if s + n > len(src) or d + n > len(dst):
        raise StageError(f"DMA of {n} bytes outside its region")
    dst[d:d + n] = src[s:s + n]


def _place(mem: dict, place: TensorPlace, which: str) -> np.ndarray:
    if place.region not in mem:
        raise StageError(f"{which} in unknown region {place.region}")
    return mem[place.region][place.offset:place.offset + place.nbytes]


def _dtype(place: TensorPlace) -> np.dtype:
    return np.dtype({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[place.elem_size]).newbyteorder("<")


def place_inputs(mem: Memory, model: RawModel, inputs: list[np.ndarray]) -> None:
    for i, (place, x) in enumerate(zip(model.inputs, inputs, strict=True)):
        x = np.asarray(x)
        if x.size != int(np.prod(place.shape)):
            raise InputError(f"input {i}: {x.size} elements, the model needs shape {list(place.shape)}")
        buf = _place(mem, place, f"input {i}")
        buf[:] = np.ascontiguousarray(x.astype(_dtype(place))).view(np.uint8).reshape(-1)


def read_outputs(mem: Memory, model: RawModel) -> list[np.ndarray]:
    outs = []
    for i, place in enumerate(model.outputs):
        buf = _place(mem, place, f"output {i}")
        outs.append(buf.copy().view(_dtype(place)).reshape(place.shape))
    return outs


def run(model: RawModel, inputs: list[np.ndarray], keep_ofms: bool = True) -> SimResult:
    """Run the command stream on integer inputs (in the artifact's NHWC shapes); returns outputs and op trace."""
    if model.generation == "u85":
        from npubuild.npusim.u85.machine import run as run_u85

        return run_u85(model, inputs, keep_ofms)
    if len(inputs) != len(model.inputs):
        raise InputError(f"the model has {len(model.inputs)} inputs, got {len(inputs)}")
    mem = region_memory(model)
    place_inputs(mem, model, inputs)
    trace: list[ops.OpResult] = []
    for cmd in decode(model.commands, model.path):
        if cmd.kind == "DMA_START":
            _dma(mem, cmd)
            continue
        try:
            if cmd.kind in ("CONV", "DEPTHWISE"):
                res = ops.run_conv(mem, cmd, model.accelerator, model.ncores)
            elif cmd.kind == "POOL":
                res = ops.run_pool(mem, cmd, model.ncores)
            else:
                res = ops.run_elementwise(mem, cmd)
        except StageError as exc:
            raise type(exc)(f"NPU op #{len(trace)} {cmd.kind}: {exc.message}") from None
        if not keep_ofms:
            res.ofm = np.zeros(0)
        trace.append(res)
    return SimResult(read_outputs(mem, model), trace)
