"""TOSA graphs built straight with tosa_serializer, and the two sides a support-rule test compares: what the
rule says (ethosu/support.py) and whether Vela compiles the graph."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import tosa_serializer as ts

from npubuild.config.accelerator import Accelerator
from npubuild.ethosu.support import check_node
from npubuild.tosa.graph import read_tosa


def tosa_attr(kind: str, *args) -> ts.TosaSerializerAttribute:
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


def tosa_serializer() -> ts.TosaSerializer:
    return ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)


def compare(op_name: str, dtype) -> bytes:
    s = tosa_serializer()
    a, b = s.addPlaceholder([1, 4, 4, 8], dtype), s.addPlaceholder([1, 4, 4, 8], dtype)
    o = s.addOutput([1, 4, 4, 8], ts.DType.BOOL)
    kind = {"EQUAL": "Equal", "GREATER": "Greater", "GREATER_EQUAL": "GreaterEqual"}[op_name]
    s.addOperator(getattr(ts.Op, op_name), [a.name, b.name], [o.name], tosa_attr(kind))
    return s.serialize()


def vela_compiles(tosa: bytes, accelerator: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "g.tosa"
        p.write_bytes(tosa)
        proc = subprocess.run([sys.executable, "-m", "ethosu.vela", str(p), "--accelerator-config", accelerator,
                               "--output-dir", str(Path(tmp) / "out")], capture_output=True, text=True, timeout=300)
        return proc.returncode == 0


def rule_verdict(tosa: bytes, accelerator: str) -> str | None:
    graph = read_tosa(tosa)
    ops = [o for o in graph.ops if o.op not in ("CONST", "CONST_SHAPE")]
    verdict = check_node(ops, graph, Accelerator.parse(accelerator).lowering_family)
    return verdict[0] if verdict else None
