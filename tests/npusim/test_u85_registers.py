"""The U85 register map against Vela's own listing: `--verbose-register-command-stream` prints every command word
with its register name and decoded fields; our disassembler must print the same for the same compile."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.npusim import lower_int
from npbtest.ops import rand, single_op_model
from npbtest.tosa_graphs import Graph, attr

from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.u85.registers import COMMANDS, disassemble

LINE = re.compile(r"^0x([0-9a-f]+):\s+(?:[0-9a-f]{8}\s+)?[0-9a-f]{4} [0-9a-f]{4} - (\S+)\s+(\d+)(?:, (.*))?$")


def vela_listing(tosa: bytes, out: Path, accelerator: str, *flags: str) -> tuple[Path, str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "m.tosa").write_bytes(tosa)
    proc = subprocess.run([sys.executable, "-m", "ethosu.vela", str(out / "m.tosa"), "--accelerator-config", accelerator,
                           "--output-format", "raw", "--output-dir", str(out), "--verbose-register-command-stream",
                           *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "m_vela.npz", proc.stdout


def parse_listing(text: str) -> list[tuple[int, str, int, dict[str, str]]]:
    """(byte offset, NPU_SET_/NPU_OP_ name, parameter, {field: value}) per listed command."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line.rstrip())
        if m:
            fields = dict(kv.split(" = ") for kv in m.group(4).split(", ")) if m.group(4) else {}
            out.append((int(m.group(1), 16), m.group(2), int(m.group(3)), fields))
    return out


def vela_rendering(name: str, fields: dict[str, str]) -> dict[str, str]:
    """Our fields as Vela prints them: its listing shows an OP_SCALAR at or above 2^31 as the value minus one
    (it adds INT_MAX - INT_MIN in unsigned arithmetic); the register holds the value itself."""
    if name == "NPU_SET_OP_SCALAR" and int(fields["scalar"]) > 0x7FFFFFFF:
        return {"scalar": str(int(fields["scalar"]) - 1)}
    return fields


def _rich_graph() -> bytes:
    """Softmax (LUTs, chained elementwise ops, CLZ, shifts), a bilinear resize, a gather and a transpose."""
    g = Graph()
    x = g.input([1, 6, 8, 16], np.int8)
    t = g.op(ts.Op.TRANSPOSE, [x], [1, 8, 6, 16], np.int8, attr("Transpose", [0, 2, 1, 3]))
    scale, offset, border = g.shape([2, 1, 2, 1]), g.shape([0, 0]), g.shape([0, 0])
    g.op(ts.Op.RESIZE, [t, scale, offset, border], [1, 15, 11, 16], np.int8, attr("Resize", ts.ResizeMode.NEAREST),
         output=True)
    v = g.input([1, 10, 16], np.int8)
    idx = g.const(np.array([[3, 9, 0, 3]]), np.int32)
    g.op(ts.Op.GATHER, [v, idx], [1, 4, 16], np.int8, attr("Gather"), output=True)
    return g.serialize()


@pytest.mark.parametrize("case,accelerator", [("conv", "ethos-u85-256"), ("softmax", "ethos-u85-128"),
                                              ("rich", "ethos-u85-2048")])
def test_disassembly_matches_vela_listing(case, accelerator, tmp_path):
    if case == "conv":
        m = single_op_model("Conv", {"x": [1, 16, 8, 8]}, {"y": None}, {"w": rand((32, 16, 3, 3), 3),
                            "b": rand((32,), 4)}, pads=[1, 1, 1, 1], strides=[2, 2])
        tosa = lower_int(m, [1, 16, 8, 8])[0]
    elif case == "softmax":
        tosa = lower_int(single_op_model("Softmax", {"x": [2, 6, 16]}, {"y": None}, axis=-1), [2, 6, 16])[0]
    else:
        tosa = _rich_graph()
    npz, text = vela_listing(tosa, tmp_path, accelerator)
    listed = parse_listing(text)
    ours = disassemble(load_raw(npz).commands)
    assert len(listed) == len(ours) > 20
    for (offset, name, param, fields), d in zip(listed, ours, strict=True):
        assert (offset, name, param) == (d.offset, d.name, d.param)
        assert fields == vela_rendering(d.name, d.fields), (hex(offset), name)
    # the op snapshots the simulator runs are the listing's operations, in order
    listed_ops = [n.removeprefix("NPU_OP_") for _, n, _, _ in listed if n.startswith("NPU_OP_")]
    kinds = [c.kind for c in decode(load_raw(npz).commands, "x", COMMANDS)]
    assert kinds == [k for k in listed_ops if k in ("CONV", "DEPTHWISE", "POOL", "ELEMENTWISE", "RESIZE", "DMA_START")]
