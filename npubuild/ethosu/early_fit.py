"""Lower bounds of a model's arena and constants from its ONNX shapes, checked against a target's pools right
after import (the early-fit stage), before quantisation, tosa-check and Vela spend minutes and gigabytes on a
model that cannot fit.

The bounds are sound (they never exceed what Vela will need), so they fail only builds the pool check after
Vela (pools.py) would fail too, with its same line:
- arena: Vela never stripes a graph's own inputs and outputs, so each one the NPU reads or writes is whole in
  the arena (1 byte per element at least), and a conv or pool reading a graph input while it writes a graph
  output holds both (a 1x16x512x512 conv: 8192 KiB, as Vela reports). Only inputs every reader of which, and
  outputs whose producer, runs on the NPU of every family count; intermediates, which Vela may cascade, do not.
- constants: every conv, depthwise conv and fully connected layer costs at least 10 bytes per output channel
  (Vela's bias and scale stream; 11-12 measured on U55 and U85 with all-zero weights), whatever weight
  compression saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from npubuild.errors import PoolsTooSmall
from npubuild.ethosu.pools import TargetPools, pool_failure, pool_usage

NPU_EVERYWHERE = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Clip", "Add", "Gemm",
                  "QuantizeLinear", "DequantizeLinear"}
HOLDS_IN_AND_OUT = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "Gemm"}
SCALE_BYTES_PER_CHANNEL = 10


@dataclass(frozen=True)
class MemoryBounds:
    arena_bytes: int
    constants_bytes: int


def _elements(vi: onnx.ValueInfoProto) -> int | None:
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in dims):
        return None
    return math.prod(d.dim_value for d in dims)


def lower_bounds(model: onnx.ModelProto) -> MemoryBounds:
    """The bounds for a model with static shapes (the import stage's output)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producer = {o: node for node in graph.node for o in node.output}
    sizes: dict[str, int] = {}
    for vi in graph.input:
        n = _elements(vi)
        if vi.name not in inits and n is not None and readers.get(vi.name) and \
                all(r.op_type in NPU_EVERYWHERE for r in readers[vi.name]):
            sizes[vi.name] = n
    for vi in graph.output:
        n = _elements(vi)
        node = producer.get(vi.name)
        if n is not None and node is not None and node.op_type in NPU_EVERYWHERE:
            sizes[vi.name] = n
    arena = max(sizes.values(), default=0)
    for node in graph.node:
        if node.op_type in HOLDS_IN_AND_OUT:
            held = sum(sizes.get(name, 0) for name in {*node.input, *node.output} if name in sizes)
            arena = max(arena, held)
    constants = 0
    for node in graph.node:
        if node.op_type in ("Conv", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            w = inits[node.input[1]]
            if w.dims:
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                channels = w.dims[0] if node.op_type == "Conv" or trans_b else w.dims[-1]
                constants += SCALE_BYTES_PER_CHANNEL * channels
    return MemoryBounds(arena, constants)


def early_pools(profile: TargetPools, bounds: MemoryBounds) -> list[dict]:
    """The target's pools charged with the lower bounds (pools.pool_usage's rows; no arena cache row)."""
    sizes = {"arena_bytes": bounds.arena_bytes, "fast_scratch_bytes": 0, "constants_bytes": bounds.constants_bytes}
    return [p for p in pool_usage(profile, sizes) if not p["pool"].endswith("(arena cache)")]


def early_failure(profile: TargetPools, bounds: MemoryBounds) -> str | None:
    """The pool check's one line if even the lower bounds do not fit the target's pools, else None."""
    return pool_failure(profile.name, early_pools(profile, bounds))


def check_fit(model_path: Path, targets: Sequence[TargetPools]) -> dict:
    """The early-fit stage's work: the imported model's lower bounds against every target it is compiled for.
    Fails (the pool check's line for the first target by name) only when not one of them can hold them: a
    build whose target alone cannot fails at the pool check after Vela, as it would anyway. Its metrics: the
    bounds and the targets they do not fit. The failure carries every target's pools with the bounds they
    need (errors.PoolsTooSmall, lower_bound): the report's fit table shows them."""
    bounds = lower_bounds(onnx.load(str(model_path)))
    ordered = sorted(targets, key=lambda t: t.name)
    failures = {t.name: early_failure(t, bounds) for t in ordered}
    lines = [f for f in failures.values() if f]
    if failures and len(lines) == len(failures):
        others = f" (and {len(lines) - 1} other targets)" if len(lines) > 1 else ""
        raise PoolsTooSmall(f"{lines[0]}{others}: a lower bound from the model's shapes, before compiling it",
                            {t.name: early_pools(t, bounds) for t in ordered}, lower_bound=True)
    return {"arena_bytes": bounds.arena_bytes, "constants_bytes": bounds.constants_bytes,
            "too_small": [name for name, f in failures.items() if f]}
