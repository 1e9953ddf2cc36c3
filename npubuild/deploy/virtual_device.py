"""The virtual device: a build's deployable .tflite run as the device runs it, without an FVP.

Operators run in their order in the flatbuffer; each ethos-u operator on npu-sim (its command stream and
constants read from the deployable: npusim/tflite.py), each run of builtin operators between them in TensorFlow
Lite Micro's own interpreter (the `tflite-micro` package), on a sub-model carved from the deployable with the
ethos-u operators excluded (TFLite Micro's Python build has no Ethos-U kernel). Tensors pass between them as
the int8 codes the device holds, in the deployable's layout. The arena TFLite Micro needs for each host run
is measured by its RecordingMicroAllocator (`print_allocations`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tflite_micro.tensorflow.lite.micro.compression import model_editor as me

from npubuild.deploy.tflite_graph import NP_TYPES
from npubuild.errors import StageError
from npubuild.npusim.sim import run as run_npu
from npubuild.npusim.tflite import ETHOS_U, OFFLINE_PLAN, NpuOperator, npu_operators
from npubuild.records.iospec import IOSpec

ARENA_LIMIT = 1 << 28  # the largest arena the interpreter is offered (then measured)


@dataclass
class HostRun:
    """Consecutive builtin operators: the sub-model, which deployable tensors it reads and writes, its arena."""

    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    model: bytes
    interpreter: object = None
    arena_bytes: int | None = None


def _host_run(data: bytes, ops: list[int], needed_later: set[int]) -> HostRun:
    m = me.read(data)
    sg = m.subgraphs[0]
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    keep = [sg.operators[k] for k in ops]
    produced = {id(t) for op in keep for t in op.outputs}
    read = [t for op in keep for t in op.inputs if t is not None]
    ins, seen = [], set()
    for t in read:
        if id(t) not in produced and t.buffer is None and id(t) not in seen:
            seen.add(id(t))
            ins.append(t)
    outs = [t for op in keep for t in op.outputs if index[id(t)] in needed_later]
    used = {id(t) for op in keep for t in [*op.inputs, *op.outputs] if t is not None}
    sg.operators = keep
    sg.tensors = [t for t in sg.tensors if id(t) in used]
    sg.inputs, sg.outputs = ins, outs
    m.metadata.pop(OFFLINE_PLAN, None)  # TFLite Micro plans the host tensors itself
    me.prune_buffers(m)
    return HostRun(ops, [index[id(t)] for t in ins], [index[id(t)] for t in outs], bytes(m.build()))


def measure_arena(interpreter) -> int | None:
    """The arena TFLite Micro allocated (its RecordingMicroAllocator's total), read from its stderr report."""
    with tempfile.TemporaryFile("w+") as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            interpreter.print_allocations()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        found = re.search(r"Arena allocation total (\d+) bytes", tmp.read())
    return int(found.group(1)) if found else None


class VirtualDevice:
    """A deployable .tflite, ready to run sample after sample."""

    def __init__(self, data: bytes, where: str = "<deployable>"):
        from tflite_micro.python.tflite_micro import runtime

        self.where = where
        m = me.read(data)
        sg = m.subgraphs[0]
        index = {id(t): i for i, t in enumerate(sg.tensors)}
        self.graph_inputs = [index[id(t)] for t in sg.inputs]
        self.graph_outputs = [index[id(t)] for t in sg.outputs]
        self.shapes = {i: tuple(int(d) for d in t.shape) for i, t in enumerate(sg.tensors)}
        self.dtypes = {i: NP_TYPES[t.dtype] for i, t in enumerate(sg.tensors)}
        npu = {op.op_index: op for op in npu_operators(data, where)}
        steps: list[list[int] | NpuOperator] = []
        for k, op in enumerate(sg.operators):
            if op.custom_code == ETHOS_U:
                steps.append(npu[k])
            elif steps and isinstance(steps[-1], list):
                steps[-1].append(k)
            else:
                steps.append([k])
        reads_after: list[set[int]] = []
        later: set[int] = set(self.graph_outputs)
        for step in reversed(steps):
            reads_after.append(set(later))
            if isinstance(step, NpuOperator):
                later |= set(step.inputs)
            else:
                later |= {index[id(t)] for k in step for t in sg.operators[k].inputs if t is not None}
        reads_after.reverse()
        self.steps: list[HostRun | NpuOperator] = []
        for step, needed in zip(steps, reads_after, strict=True):
            if isinstance(step, NpuOperator):
                self.steps.append(step)
                continue
            host = _host_run(data, step, needed)
            try:
                host.interpreter = runtime.Interpreter.from_bytes(host.model, arena_size=ARENA_LIMIT)
            except Exception as exc:  # noqa: BLE001 - TFLite Micro's refusal (an op it has no kernel for), one line
                raise StageError(f"TensorFlow Lite Micro cannot load the host operators {step}: "
                                 f"{' '.join(str(exc).split())[:200]}") from None
            self.steps.append(host)

    @property
    def host_arena_bytes(self) -> int | None:
        """The largest arena a host run needed (measured after a run), None before one."""
        sizes = [s.arena_bytes for s in self.steps if isinstance(s, HostRun) and s.arena_bytes is not None]
        return max(sizes) if sizes else None

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The graph outputs (the codes the device writes, in the deployable's layout) for these inputs."""
        if len(inputs) != len(self.graph_inputs):
            raise StageError(f"the deployable has {len(self.graph_inputs)} inputs, got {len(inputs)}")
        env: dict[int, np.ndarray] = {}
        for i, x in zip(self.graph_inputs, inputs, strict=True):
            env[i] = np.asarray(x).astype(self.dtypes[i]).reshape(self.shapes[i])
        for step in self.steps:
            if isinstance(step, NpuOperator):
                outs = run_npu(step.model, [env[i] for i in step.inputs], keep_ofms=False).outputs
                for i, y in zip(step.outputs, outs, strict=True):
                    env[i] = y.reshape(self.shapes[i]).astype(self.dtypes[i])
                continue
            it = step.interpreter
            for k, i in enumerate(step.inputs):
                it.set_input(env[i], k)
            it.invoke()
            for k, i in enumerate(step.outputs):
                env[i] = np.array(it.get_output(k)).reshape(self.shapes[i])
            if step.arena_bytes is None:
                step.arena_bytes = measure_arena(it)
        return [env[i] for i in self.graph_outputs]


class OnDevice:
    """The deployable run on the model's own inputs: ONNX-layout float (or bool, index) feeds in, the codes the
    device writes out, back in ONNX layout (`{output name: raw}`, as the TOSA check's graphs give them). The
    deployable's I/O specs (the vela stage's `deployable` metrics) say how each is quantised and laid out."""

    def __init__(self, data: bytes, inputs: Sequence[IOSpec], outputs: Sequence[IOSpec], where: str = "<deployable>"):
        self.device = VirtualDevice(data, where)
        self.inputs, self.outputs = list(inputs), list(outputs)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = self.device.run([s.to_tosa(feeds[s.onnx_name]) if s.quantized else  # a bool or index input as it is
                               np.transpose(np.asarray(feeds[s.onnx_name]), s.perm).astype(s.dtype)
                               for s in self.inputs])
        return {spec.onnx_name: spec.from_tosa(np.asarray(y).reshape(spec.shape))
                for spec, y in zip(self.outputs, got, strict=True)}
