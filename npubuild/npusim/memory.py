"""The NPU's memory as every generation's machine sees it: the artifact's regions (weights, scratch, fast
scratch, separate I/O) and the internal memory, the graph inputs placed and the outputs read back."""

from __future__ import annotations

import numpy as np

from npubuild.errors import InputError, StageError
from npubuild.npusim.npz import RawModel, TensorPlace

INTERNAL = "internal"  # key of the NPU's internal memory (SHRAM: LUTs) in the region map


class Memory(dict):
    """Region index (or INTERNAL) -> bytes; a region the artifact does not define is a one-line error."""

    def __missing__(self, key):
        raise StageError(f"the command stream uses region {key}, which the artifact does not define")


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


def batched(mem: Memory, samples: int) -> Memory:
    """The same regions with a leading sample axis: one row of memory per sample, so that one pass over the
    command stream runs them all (a U55 stream of thousands of small ops costs its Python per op once)."""
    return Memory({k: np.repeat(v[None], samples, axis=0) for k, v in mem.items()})


def batch_memory(model: RawModel, samples: list[list[np.ndarray]]) -> Memory:
    """The artifact's regions batched over `samples`, each sample's inputs placed in its row: where every
    generation's run over a batch starts."""
    for inputs in samples:
        if len(inputs) != len(model.inputs):
            raise InputError(f"the model has {len(model.inputs)} inputs, got {len(inputs)}")
    mem = batched(region_memory(model), len(samples))
    for row, inputs in enumerate(samples):
        place_inputs(mem, model, inputs, row)
    return mem


def constant_bytes(region: np.ndarray, start: int, length: int, what: str) -> bytes:
    """Bytes an op reads as constants (weights, scales, LUTs): alike in every sample's memory, where they come
    from the read-only region (directly or by DMA); a batch whose samples disagree is npu-sim's error."""
    block = region[..., start:start + length]
    first = block[(0,) * (block.ndim - 1)]
    if block.ndim > 1 and not (block == first).all():
        raise StageError(f"{what} differ between the samples of a batch")
    return first.tobytes()


def region_of(mem: dict, reg: int) -> np.ndarray:
    """A DMA end: bit 8 selects the internal memory, else the low byte is the region index."""
    return mem[INTERNAL if reg >> 8 & 1 else reg & 0xFF]


def _place(mem: dict, place: TensorPlace, which: str) -> np.ndarray:
    if place.region not in mem:
        raise StageError(f"{which} in unknown region {place.region}")
    return mem[place.region][..., place.offset:place.offset + place.nbytes]


def _dtype(place: TensorPlace) -> np.dtype:
    return np.dtype({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[place.elem_size]).newbyteorder("<")


def place_inputs(mem: Memory, model: RawModel, inputs: list[np.ndarray], row: int | None = None) -> None:
    """One sample's inputs into memory (into its `row` of a batched memory)."""
    for i, (place, x) in enumerate(zip(model.inputs, inputs, strict=True)):
        x = np.asarray(x)
        if x.size != int(np.prod(place.shape)):
            raise InputError(f"input {i}: {x.size} elements, the model needs shape {list(place.shape)}")
        buf = _place(mem, place, f"input {i}")
        if row is not None:
            buf = buf[row]
        buf[:] = np.ascontiguousarray(x.astype(_dtype(place))).view(np.uint8).reshape(-1)


def read_outputs(mem: Memory, model: RawModel, row: int | None = None) -> list[np.ndarray]:
    """The graph outputs of one sample (of its `row` of a batched memory)."""
    outs = []
    for i, place in enumerate(model.outputs):
        buf = _place(mem, place, f"output {i}")
        if row is not None:
            buf = buf[row]
        outs.append(buf.copy().view(_dtype(place)).reshape(place.shape))
    return outs
