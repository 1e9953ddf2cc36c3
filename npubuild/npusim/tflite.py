"""Read the NPU work of a TFLite flatbuffer: each `ethos-u` custom operator as a `RawModel` npu-sim runs.

This is what the device runs, byte for byte: the TFLite Micro Ethos-U kernel hands the driver the operator's
first input as the command stream (a COP1 driver payload) and the base address of every further input and
output as regions 0, 1, 2, ... (read-only constants, the scratch arena, the fast scratch, then the IFMs and
OFMs). Vela places its IFMs and OFMs inside the scratch tensor through the model's `OfflineMemoryAllocation`
metadata, and its command stream addresses them as region 1 plus their offset from the scratch tensor; an
I/O tensor planned outside it (offset -1) is addressed through its own region. Vela's raw .npz of the same
compile holds the same command words and constants (tests/npusim/test_tflite_artifact.py), so npu-sim on
the .tflite checks the deployed artifact without a second Vela run.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.errors import InputError
from npubuild.npusim.npz import RawModel, TensorPlace, accelerator_of, parse_driver_payload

ETHOS_U = "ethos-u"
OFFLINE_PLAN = "OfflineMemoryAllocation"
READ_ONLY, SCRATCH, SCRATCH_FAST = 0, 1, 2  # the driver's region numbers for the operator's inputs 1, 2, 3
ELEMENT_BYTES = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1, 10: 8}  # tflite TensorType -> bytes


@dataclass(frozen=True)
class NpuOperator:
    """One ethos-u operator: its position in the subgraph, the tensors it reads and writes, and its artifact."""

    op_index: int
    inputs: tuple[int, ...]  # tensor indices of its IFMs (after the command stream, constants and scratches)
    outputs: tuple[int, ...]
    model: RawModel
    payload: bytes = b""  # its command stream tensor: the driver payload (COP1 header + command words)
    fast_of_its_own: bool = False  # a fast-scratch tensor apart from the scratch (an arena cache)


def offline_offsets(metadata: dict[str, bytes], n_tensors: int, where: str) -> list[int]:
    """The arena offset of every tensor of subgraph 0 (-1: planned at run time), or all -1 without a plan."""
    raw = metadata.get(OFFLINE_PLAN)
    if raw is None:
        return [-1] * n_tensors
    words = struct.unpack(f"<{len(raw) // 4}i", raw[: len(raw) // 4 * 4])
    if len(words) < 3 or words[2] != n_tensors or len(words) < 3 + n_tensors:
        raise InputError(f"{OFFLINE_PLAN} metadata names {words[2] if len(words) > 2 else 0} tensors, the "
                         f"subgraph has {n_tensors}", where)
    return list(words[3:3 + n_tensors])


def _place(tensor, offsets: list[int], index: int, scratch_at: int, own_region: int) -> TensorPlace:
    shape = tuple(int(d) for d in tensor.shape)
    size = ELEMENT_BYTES.get(int(tensor.dtype))
    if size is None:
        raise InputError(f"ethos-u operator I/O tensor '{tensor.name}' has unsupported type {tensor.dtype}")
    if offsets[index] < 0 or scratch_at < 0:
        return TensorPlace(shape, size, own_region, 0)
    return TensorPlace(shape, size, SCRATCH, offsets[index] - scratch_at)


def npu_operators(data: bytes, where: str = "<tflite>") -> list[NpuOperator]:
    """Every ethos-u operator of subgraph 0, in run order."""
    from tflite_micro.tensorflow.lite.micro.compression import model_editor

    try:
        model = model_editor.read(bytes(data))
    except Exception as exc:  # noqa: BLE001 - a damaged flatbuffer, as one line
        raise InputError(f"not a TFLite flatbuffer: {' '.join(str(exc).split())[:160]}", where) from None
    if not model.subgraphs:
        return []
    sg = model.subgraphs[0]
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    offsets = offline_offsets(model.metadata, len(sg.tensors), where)
    found = []
    for op in sg.operators:
        if op.custom_code != ETHOS_U:
            continue
        if len(op.inputs) < 4 or any(t is None for t in op.inputs):
            raise InputError(f"ethos-u operator {op.index} has {len(op.inputs)} inputs; Vela writes the command "
                             "stream, constants, scratch and fast scratch first", where)
        cms, const, scratch, fast, *ifms = op.inputs
        ofms = list(op.outputs)
        # Vela may list its operator's outputs in another order than the graph's (a graph input passed through
        # beside a computed output): graph order, which the TOSA graph and the raw .npz use, where they are its own
        for io, graph_io in ((ifms, sg.inputs), (ofms, sg.outputs)):
            if all(any(t is g for g in graph_io) for t in io):
                io.sort(key=lambda t, g=graph_io: next(k for k, x in enumerate(g) if x is t))
        commands, product, macs, shram = parse_driver_payload(bytes(cms.buffer or b""), where)
        accel, ncores = accelerator_of(product, macs, where)
        scratch_at = offsets[index[id(scratch)]]
        fast_size = 0 if fast is scratch else int(np.prod(fast.shape))
        n_in = 4 + len(ifms)
        ins = [_place(t, offsets, index[id(t)], scratch_at, 3 + op.inputs.index(t) - 4) for t in ifms]
        outs = [_place(t, offsets, index[id(t)], scratch_at, n_in - 1 + op.outputs.index(t)) for t in ofms]
        raw = RawModel(f"{where}#op{op.index}", accel, ncores, commands, bytes(const.buffer or b""), READ_ONLY,
                       SCRATCH, int(np.prod(scratch.shape)), SCRATCH_FAST, fast_size, max(shram // ncores, 16),
                       ins, outs)
        found.append(NpuOperator(op.index, tuple(index[id(t)] for t in ifms), tuple(index[id(t)] for t in ofms), raw,
                                 bytes(cms.buffer or b""), fast is not scratch))
    return found


def load_tflite(path: str | Path) -> list[RawModel]:
    """The artifact of every ethos-u operator in a .tflite (Vela's output or npubuild's deployable)."""
    return [op.model for op in npu_operators(Path(path).read_bytes(), str(path))]
