"""ONNX external data, read only from under the model's own directory and folded into the model.

A tensor stored outside the .onnx file names a `location` that onnx and
onnx-ir would resolve against the current directory: a model saying
`location: .aws/credentials`, built from a home directory, would copy that
file's bytes into the imported model. Here every external tensor is resolved
against the directory of the model file, refused (one line, exit 2) if it is an
absolute path, leaves that directory (`..`, a symlink), is not a regular file
(a FIFO would hang the read) or does not hold exactly the tensor's bytes; its
bytes then become the tensor's raw_data, so the imported model is
self-contained and no later stage reads a path from it.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import TensorProto

from npubuild.errors import InputError

SUB_BYTE_BITS = {TensorProto.UINT4: 4, TensorProto.INT4: 4, TensorProto.FLOAT4E2M1: 4,
                 TensorProto.UINT2: 2, TensorProto.INT2: 2}


def tensor_nbytes(t: TensorProto) -> int | None:
    """Bytes of raw_data a tensor of its type and dims holds (None: variable-size strings, or an unknown type)."""
    if t.data_type == TensorProto.STRING:
        return None
    n = math.prod(t.dims)
    bits = SUB_BYTE_BITS.get(t.data_type)
    if bits is not None:
        return (n * bits + 7) // 8
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def graph_tensors(graph: onnx.GraphProto, owner: str = "") -> Iterator[tuple[TensorProto, str]]:
    """Every tensor a graph holds (initializers, sparse initializers, attribute tensors, subgraphs), each with
    what to call it in an error: the node attributes name their node."""
    for t in graph.initializer:
        yield t, f"initializer '{t.name}'{owner}"
    for s in graph.sparse_initializer:
        yield s.values, f"sparse initializer '{s.values.name}'{owner}"
        yield s.indices, f"sparse initializer '{s.values.name}' indices{owner}"
    for node in graph.node:
        where = f"node '{node.name}' ({node.op_type})"
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t, f"{where} attribute '{a.name}'"
            for t in a.tensors:
                yield t, f"{where} attribute '{a.name}'"
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values, f"{where} attribute '{a.name}'"
                yield a.sparse_tensor.indices, f"{where} attribute '{a.name}' indices"
            if a.HasField("g"):
                yield from graph_tensors(a.g, f" in {where}")
            for g in a.graphs:
                yield from graph_tensors(g, f" in {where}")


def model_tensors(model: onnx.ModelProto) -> Iterator[tuple[TensorProto, str]]:
    yield from graph_tensors(model.graph)
    for f in model.functions:
        for node in f.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t, f"function '{f.name}' node '{node.name}' ({node.op_type}) attribute '{a.name}'"


def fold_external_data(model: onnx.ModelProto, model_dir: Path, where: str) -> int:
    """Read every external tensor from under `model_dir` into the model; returns how many were folded."""
    base = model_dir.resolve()
    folded = 0
    for t, what in model_tensors(model):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        t.raw_data = _read(t, what, base, where)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
        folded += 1
    return folded


def _read(t: TensorProto, what: str, base: Path, where: str) -> bytes:
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if not loc:
        raise InputError(f"{what}: external data without a location", where)
    if os.path.isabs(loc) or loc.startswith("~"):
        raise InputError(f"{what}: external data '{loc}' is an absolute path; only files in the model's "
                         f"directory {base} are read", where)
    path = (base / loc).resolve()
    if base not in path.parents:
        raise InputError(f"{what}: external data '{loc}' is outside the model's directory {base}", where)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{what}: external data '{loc}': {exc.strerror}", where) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what}: external data '{loc}' is not a regular file", where)
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else st.st_size - offset
    except ValueError:
        raise InputError(f"{what}: external data offset/length are not integers", where) from None
    expected = tensor_nbytes(t)
    if expected is None:
        raise InputError(f"{what}: external data for a tensor of type "
                         f"{TensorProto.DataType.Name(t.data_type) if t.data_type in TensorProto.DataType.values() else t.data_type}"
                         " is not supported", where)
    if offset < 0 or length < 0 or offset + length > st.st_size:
        raise InputError(f"{what}: external data '{loc}' has {st.st_size} bytes, the tensor asks for "
                         f"{length} at offset {offset}", where)
    if length != expected:
        raise InputError(f"{what}: external data holds {length} bytes, a tensor of shape {list(t.dims)} "
                         f"needs {expected}", where)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise InputError(f"{what}: external data '{loc}' ended early", where)
    return data


def external_data_files(model: Path) -> dict[str, Path]:
    """The files an ONNX model's external tensors name beside it (path relative to the model's directory ->
    file); {} for anything else. What the import stage reads besides the model (fold_external_data), found
    without reading the tensors: the engine hashes them into the import task's key, reruns the import when
    one changes and ships them with the model to a Dask worker. A location the import would refuse is left
    out: the stage says why when it runs."""
    if model.suffix != ".onnx":
        return {}
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model the import stage accepts: it says so when it runs
        return {}
    base = model.parent.resolve()
    out: dict[str, Path] = {}
    for t, _ in model_tensors(proto):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        path = (base / loc).resolve() if loc else base
        if loc and base in path.parents and path.is_file():
            out[path.relative_to(base).as_posix()] = path
    return out
