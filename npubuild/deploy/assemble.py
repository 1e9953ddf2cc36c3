"""One .tflite per build: Vela's ethos-u operators for the NPU partitions, TFLite builtins for the host ones.

Each NPU partition is the ethos-u operator of Vela's own .tflite for it, byte for byte (command stream,
read-only constants, custom options); each host partition its QDQ ONNX translated by host_ops.py. The
tensors between partitions are int8 in the layout and quantisation of the NPU side that reads or writes them
(io.json's IOSpecs), so the host operators convert exactly where onnxruntime's DequantizeLinear/QuantizeLinear
do. A fully offloaded build's deployable is Vela's .tflite itself.

The arena plan: Vela placed each partition's scratch, fast scratch and I/O at offsets its command stream
addresses relative to the scratch tensor (its OfflineMemoryAllocation). Each partition keeps that block
whole; the blocks are placed first fit by lifetime, so two blocks never share bytes while both are live, and
the host tensors are left to TFLite Micro's planner around them (-1), as Vela leaves its CPU tensors. A tensor
one NPU partition writes and another reads directly gets a copy (RESHAPE), since it cannot sit at both
partitions' offsets at once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from tflite_micro.tensorflow.lite.micro.compression import model_editor as me

from npubuild.deploy.host_ops import HostTranslation, NotDeployable, Value, emit_host_partition, write_into
from npubuild.deploy.tflite_graph import NP_TYPES, Quant, TflGraph
from npubuild.npusim.tflite import ETHOS_U, OFFLINE_PLAN, offline_offsets
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import PartitionRecord, Where

ALIGN = 16


@dataclass
class PartitionResult:
    """What one partition became in the deployable: the ethos-u operator, or the builtins of a host one."""

    index: int
    kind: str
    builtins: list[str] = field(default_factory=list)
    not_deployable: str | None = None  # why TensorFlow Lite Micro cannot run this host partition
    arena_bytes: int | None = None  # an NPU partition's block (Vela's scratch and I/O)
    ops: range = range(0)  # its operators' positions in the deployable


@dataclass
class Deployable:
    data: bytes | None  # None when a host partition has no TFLite translation
    partitions: list[PartitionResult]
    outputs: list[IOSpec]  # the graph outputs as the deployable holds them (layout, quantisation)
    inputs: list[IOSpec]
    npu_arena_bytes: int = 0  # the offline-planned part of the arena (every NPU block, placed)


@dataclass
class _Block:
    tensors: list[tuple[me.Tensor, int]]  # (tensor, offset in Vela's plan)
    size: int
    base: int = 0


def device_dtype(dtype: str) -> np.dtype:
    """The type a tensor has on the device: TensorFlow Lite Micro has no int64 kernels (GATHER positions, CAST), so
    an int64 graph input (token ids) is int32 there."""
    return np.dtype(np.int32) if np.dtype(dtype) == np.int64 else np.dtype(dtype)


def _spec_quant(spec: IOSpec) -> Quant | None:
    return Quant(float(spec.scale), int(spec.zero_point), spec.dtype) if spec.scale is not None else None


def _spec_value(g: TflGraph, spec: IOSpec, name: str | None = None) -> Value:
    q = _spec_quant(spec)
    dtype = device_dtype(spec.dtype)
    t = g.tensor(name or spec.onnx_name, spec.shape, dtype, q)
    return Value(t, tuple(spec.onnx_shape), tuple(spec.perm), q, None if q else dtype)


def _same_form(v: Value, spec: IOSpec) -> bool:
    q = _spec_quant(spec)
    return v.perm == tuple(spec.perm) and v.quant == q and v.physical_shape == tuple(spec.shape)


def _host_output_spec(model: onnx.ModelProto, name: str, shape: tuple[int, ...]) -> IOSpec:
    """A host partition output nothing on the NPU reads (another host partition does): int8 (int16) at its
    DequantizeLinear's parameters where the QDQ model quantises it, else in its own type (a comparison's bool,
    an index), as onnxruntime passes it."""
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    dq = next((n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == name), None)
    rank = len(shape)
    if dq is None:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(_onnx_type(model, name).elem_type))
        return IOSpec(name, name, tuple(shape), tuple(range(rank)), dtype.name, None, None)
    scale, zp = consts[dq.input[1]], consts[dq.input[2]]
    return IOSpec(name, name, tuple(shape), tuple(range(rank)), zp.dtype.name, float(scale), int(zp))


def _onnx_type(model: onnx.ModelProto, name: str) -> onnx.TypeProto.Tensor:
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if vi.name == name:
            return vi.type.tensor_type
    raise KeyError(name)


def _onnx_shape(model: onnx.ModelProto, name: str) -> tuple[int, ...]:
    return tuple(d.dim_value for d in _onnx_type(model, name).shape.dim)


def assemble(partitions: Sequence[PartitionRecord], inputs: Sequence[IOSpec], outputs: Sequence[IOSpec],
             lower_dir: Path, vela_tflite: dict[int, Path]) -> Deployable:
    """The deployable of one family's split model (partitions in run order; `inputs`/`outputs` the graph's own
    specs, used where a host partition reads a graph input or writes a graph output)."""
    npu = [p for p in partitions if p.kind == Where.NPU]
    if len(partitions) == 1 and npu:  # fully offloaded: Vela's own output is the deployable
        data = vela_tflite[npu[0].index].read_bytes()
        return Deployable(data, [PartitionResult(npu[0].index, "npu", ["ethos-u"])], list(npu[0].outputs_io),
                          list(npu[0].inputs_io), 0)
    g = TflGraph("npubuild deployable")
    readers = _npu_reader_specs(partitions)
    values: dict[str, Value] = {}
    for spec in inputs:  # a graph input laid out as the NPU partition reading it takes it, if one does
        values[spec.onnx_name] = _spec_value(g, readers.get(spec.onnx_name, spec))
    graph_in = [values[s.onnx_name].tensor for s in inputs]
    out_specs = {s.onnx_name: s for s in outputs}
    results: list[PartitionResult] = []
    blocks: list[_Block] = []
    for part in partitions:
        first = len(g.sg.operators)
        if part.kind == Where.NPU:
            blocks.append(_npu_partition(g, part, values, vela_tflite[part.index]))
            results.append(PartitionResult(part.index, "npu", ["ethos-u"], arena_bytes=blocks[-1].size,
                                           ops=range(first, len(g.sg.operators))))
            continue
        model = onnx.load(str(lower_dir / part.file))
        ins = {n: values[n] for n in part.inputs}
        outs = {}
        try:
            for n in part.outputs:
                spec = readers.get(n) or out_specs.get(n) or _host_output_spec(model, n, _onnx_shape(model, n))
                outs[n] = _spec_value(g, spec)
            used = emit_host_partition(g, model, ins, outs)
        except NotDeployable as exc:
            results.append(PartitionResult(part.index, "host", not_deployable=str(exc)))
            return Deployable(None, results + [PartitionResult(p.index, p.kind) for p in partitions
                                               if p.index > part.index], list(outputs), list(inputs))
        values.update(outs)
        results.append(PartitionResult(part.index, "host", sorted(used), ops=range(first, len(g.sg.operators))))
    graph_out = [values[s.onnx_name] for s in outputs]
    g.sg.inputs, g.sg.outputs = graph_in, [v.tensor for v in graph_out]
    npu_arena = _plan(g, blocks)
    out_io = [IOSpec(s.onnx_name, s.onnx_name, v.physical_shape, v.perm, s.dtype,
                     v.quant.scale if v.quant else None, v.quant.zero_point if v.quant else None)
              for s, v in zip(outputs, graph_out, strict=True)]
    in_io = [IOSpec(s.onnx_name, s.onnx_name, values[s.onnx_name].physical_shape, values[s.onnx_name].perm,
                    device_dtype(s.dtype).name, s.scale, s.zero_point) for s in inputs]
    return Deployable(g.build(), results, out_io, in_io, npu_arena)


def _npu_reader_specs(partitions: Sequence[PartitionRecord]) -> dict[str, IOSpec]:
    """Every tensor an NPU partition reads, with the spec it reads it in (the first reader's)."""
    specs: dict[str, IOSpec] = {}
    for p in partitions:
        if p.kind == Where.NPU:
            for s in p.inputs_io or ():
                specs.setdefault(s.onnx_name, s)
    return specs


def _npu_partition(g: TflGraph, part: PartitionRecord, values: dict[str, Value], tflite: Path) -> _Block:
    """Vela's ethos-u operator of this partition, its I/O bound to the deployable's tensors."""
    vm = me.read(tflite.read_bytes())
    sg = vm.subgraphs[0]
    (op,) = [o for o in sg.operators if o.custom_code == ETHOS_U]
    offsets = offline_offsets(vm.metadata, len(sg.tensors), str(tflite))
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    cms, const, scratch, fast, *ifms = op.inputs
    stem = Path(part.file).stem

    def copy(t: me.Tensor, name: str) -> me.Tensor:
        data = None if t.buffer is None else np.frombuffer(bytes(t.buffer), np.uint8)
        if data is not None:
            return g.const(data, name)
        return g.tensor(name, t.shape, np.uint8)

    new_cms, new_const = copy(cms, f"{stem}_command_stream"), copy(const, f"{stem}_read_only")
    new_scratch = copy(scratch, f"{stem}_scratch")
    new_fast = new_scratch if fast is scratch else copy(fast, f"{stem}_scratch_fast")
    block = [(new_scratch, offsets[index[id(scratch)]])]
    if fast is not scratch:
        block.append((new_fast, offsets[index[id(fast)]]))
    in_tensors = []
    ifms, ofms = _by_name(ifms, part.inputs_io or ()), _by_name(op.outputs, part.outputs_io or ())
    for spec, t in zip(part.inputs_io or (), ifms, strict=True):
        v = values[spec.onnx_name]
        if not _same_form(v, spec) or any(v.tensor is b for b, _ in block) or _in_a_block(g, v.tensor):
            v = _convert(g, v, spec, f"{stem}_{spec.tosa_name}")
        in_tensors.append(v.tensor)
        block.append((v.tensor, offsets[index[id(t)]]))
    out_tensors = []
    for spec, t in zip(part.outputs_io or (), ofms, strict=True):
        v = _spec_value(g, spec, f"{spec.onnx_name}")
        values[spec.onnx_name] = v
        out_tensors.append(v.tensor)
        block.append((v.tensor, offsets[index[id(t)]]))
    new_op = g.sg.add_operator(opcode=op.opcode, custom_code=ETHOS_U,
                               inputs=[new_cms, new_const, new_scratch, new_fast, *in_tensors], outputs=out_tensors)
    new_op._fb.customOptions = op._fb.customOptions
    new_op._fb.customOptionsFormat = op._fb.customOptionsFormat
    g.blocked.update(id(t) for t, _ in block)
    planned = [(t, off) for t, off in block if off >= 0]
    lo = min((off for _, off in planned), default=0)
    size = max((off - lo + _nbytes(t) for t, off in planned), default=0)
    return _Block([(t, off - lo) for t, off in planned], _align(size))


def _by_name(tensors: list[me.Tensor], specs) -> list[me.Tensor]:
    """Vela's operator I/O in the order of the partition's specs: by TOSA tensor name (Vela may reorder them)."""
    named = {t.name: t for t in tensors}
    if all(s.tosa_name in named for s in specs):
        return [named[s.tosa_name] for s in specs]
    return list(tensors)


def _in_a_block(g: TflGraph, t: me.Tensor) -> bool:
    return id(t) in g.blocked


def _convert(g: TflGraph, v: Value, spec: IOSpec, name: str) -> Value:
    """A tensor of its own in the form an NPU partition reads (layout, quantisation), copied or converted."""
    target = _spec_value(g, spec, name)
    t = HostTranslation(g, onnx.ModelProto())
    first = len(g.sg.operators)
    v2 = t.in_layout(v, target.perm)
    v2 = t.quantize(v2, target.quant) if target.quant is not None else v2
    write_into(t, v2, target, first)
    return target


def _nbytes(t: me.Tensor) -> int:
    return int(np.prod(t.shape)) * NP_TYPES[t.dtype].itemsize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _lifetimes(g: TflGraph) -> dict[int, tuple[int, int]]:
    life: dict[int, list[int]] = {}
    ops = g.sg.operators
    for k, op in enumerate(ops):
        for t in [*op.inputs, *op.outputs]:
            if t is not None:
                span = life.setdefault(id(t), [k, k])
                span[0], span[1] = min(span[0], k), max(span[1], k)
    for t in g.sg.inputs:
        life.setdefault(id(t), [0, 0])[0] = 0
    for t in g.sg.outputs:
        life.setdefault(id(t), [len(ops), len(ops)])[1] = len(ops)
    return {k: (a, b) for k, (a, b) in life.items()}


def _plan(g: TflGraph, blocks: list[_Block]) -> int:
    """Place every NPU block first fit by lifetime; write OfflineMemoryAllocation; the planned bytes."""
    life = _lifetimes(g)
    spans = []
    for b in blocks:
        ts = [life.get(id(t), (0, 0)) for t, _ in b.tensors]
        spans.append((min(a for a, _ in ts), max(z for _, z in ts)))
    placed: list[tuple[int, int, int, int]] = []  # base, end, t0, t1
    for b, (t0, t1) in sorted(zip(blocks, spans, strict=True), key=lambda x: -x[0].size):
        live = sorted((pb, pe) for pb, pe, s0, s1 in placed if not (s1 < t0 or t1 < s0))
        base = 0
        for pb, pe in live:  # first fit: the lowest base clear of every block live at the same time
            if base + b.size > pb and base < pe:
                base = _align(pe)
        b.base = base
        placed.append((base, base + b.size, t0, t1))
    offset = {id(t): b.base + off for b in blocks for t, off in b.tensors}
    words = [offset.get(id(t), -1) for t in g.sg.tensors]
    g.model.metadata[OFFLINE_PLAN] = struct.pack(f"<{3 + len(words)}i", 0, 1, len(words), *words)
    return max((e for _, e, _, _ in placed), default=0)
