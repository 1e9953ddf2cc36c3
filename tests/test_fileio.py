"""fileio.dumps_indented writes what json.dumps(indent=2) writes, to the byte, for every kind of value records hold."""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from npubuild.fileio import _json_default, dumps_indented, write_json


class Level(enum.IntEnum):
    LOW = 1


def _values() -> dict:
    rng = np.random.default_rng(0)
    layers = [{"tensor": f"layer-{i}", "cycles": int(c), "pct": float(p), "bytes": {"Sram": int(c) * 3, "Dram": 0},
               "roofline": {"bound_ms": float(p) / 7, "memory_bound_ms": {}}, "ops": [], "note": None,
               "ok": bool(i % 2)} for i, (c, p) in enumerate(zip(rng.integers(0, 10**9, 50), rng.random(50), strict=True))]
    return {
        "layers": layers,
        "floats": [0.0, -0.0, 1e16, 1e-7, 1 / 3, 2.5e300, math.nan, math.inf, -math.inf, np.float64(0.1)],
        "ints": [0, -1, 10**30, True, False, Level.LOW],
        "strings": ["", "é", 'quote " and \\ backslash', "new\nline\ttab", "\u2028", "😀"],
        "numpy": [np.float32(1.5), np.int64(-3), np.bool_(True), np.arange(4).reshape(2, 2), np.zeros(0)],
        "paths": Path("/a/b"),
        "nested": [[[]], [{}], ({"t": (1, 2)},), [[1, [2, [3]]]]],
        "keys": {7: "int", 2.5: "float", False: "bool", None: "none", "s": OrderedDict(b=1, a=2)},
    }


def test_dumps_indented_matches_json_dumps_indent_2():
    obj = _values()
    assert dumps_indented(obj) == json.dumps(obj, indent=2, default=_json_default)
    for scalar in ("top", 3, 2.5, None, True, [], {}, np.int32(7)):
        assert dumps_indented(scalar) == json.dumps(scalar, indent=2, default=_json_default)


def test_dumps_indented_refuses_what_json_dumps_refuses(tmp_path: Path):
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        dumps_indented({"x": [object()]})
    with pytest.raises(TypeError, match="keys must be str"):
        dumps_indented({(1, 2): 3})
    write_json(tmp_path / "r.json", _values()["layers"])
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(_values()["layers"]))
