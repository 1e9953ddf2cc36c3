"""Find a compiled Vela artifact (a .tflite with one ethos-u operator, or a raw .npz) and the TOSA I/O description
next to it, from a path the user gives."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.errors import InputError
from npubuild.npusim.npz import RawModel
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord


@dataclass
class Artifact:
    path: Path  # <stem>_vela.tflite or <stem>_vela.npz
    label: str
    io: LowerRecord | None = None  # the lower stage's io.json, when known (quantisation, ONNX layout)
    tosa: Path | None = None


def vela_stem_of(path: Path) -> str:
    return path.name.removesuffix(".npz").removesuffix(".tflite").removesuffix("_vela")


def load_artifact(path: Path) -> RawModel:
    """The one NPU command stream of a Vela output: its .tflite's ethos-u operator or its raw .npz."""
    from npubuild.npusim.npz import load_raw
    from npubuild.npusim.tflite import load_tflite

    if path.suffix == ".npz":
        return load_raw(path)
    models = load_tflite(path)
    if len(models) != 1:
        raise InputError(f"{len(models)} ethos-u operators: run a deployable with host operators as a build "
                         "directory or its .tflite", str(path))
    return models[0]


def layer_cycles(path: Path) -> dict[str, int]:
    """Vela's per-layer cycle estimate (its --verbose-performance CSV next to the artifact), by layer name."""
    import csv

    stem = vela_stem_of(path)
    for d in (path.parent, path.parent.parent):
        for p in sorted(d.glob(f"{stem}_per-layer.csv")):
            with open(p, newline="") as f:
                rows = list(csv.DictReader(f))
            out = {}
            for r in rows:
                try:
                    out[r["Name"].strip()] = int(float(r["Op Cycles"]))
                except (KeyError, ValueError):
                    continue
            return out
    return {}


def _io_next_to(tosa: Path | None) -> LowerRecord | None:
    if tosa is None:
        return None
    p = tosa.parent / "io.json"
    return LowerRecord.read(p) if p.is_file() else None


def _compiled_tosa(artifact: Path, tosa: str | None) -> Path | None:
    """The graph Vela compiled: a lowering family's own (u85wide_model.tosa beside model.tosa) when it has one."""
    if not tosa:
        return None
    own = Path(tosa).parent / f"{vela_stem_of(artifact)}.tosa"
    return own if own.is_file() else Path(tosa)


def _from_report(build_dir: Path, select: str | None) -> Artifact:
    report = json.loads((build_dir / "report.json").read_text())
    found = []
    for b in report.get("builds", []):
        vela = (b.get("artifacts") or {}).get("vela")
        if not vela:
            continue
        label = f"{b['spec']}/{b['model']}/{b['target']}"
        if select and select not in (label, b["target"], f"{b['model']}/{b['target']}"):
            continue
        tosa = (b.get("artifacts") or {}).get("tosa")
        found.append(Artifact(Path(vela), f"{label} ({Path(vela).name})", None, _compiled_tosa(Path(vela), tosa)))
    if not found:
        what = f" matching '{select}'" if select else ""
        raise InputError(f"no build with a Vela artifact{what}", str(build_dir))
    if len(found) > 1:
        names = ", ".join(a.label.split(" (")[0] for a in found)
        raise InputError(f"several builds ({names}): choose one with --build", str(build_dir))
    art = found[0]
    art.io = _io_next_to(art.tosa)
    return art


def locate(path: str, select: str | None = None) -> Artifact:
    """A Vela .npz or .tflite, a vela stage directory holding one, or a build directory with report.json."""
    p = Path(path)
    if p.is_file():
        if p.suffix not in (".npz", ".tflite"):
            raise InputError("expected a Vela .tflite or raw .npz, or a build directory", path)
        return Artifact(p, p.name)
    if not p.is_dir():
        raise InputError("no such file or directory", path)
    if (p / "report.json").is_file():
        return _from_report(p, select)
    found = sorted(p.glob("*_vela.npz")) or sorted(p.glob("*_vela.tflite"))
    if len(found) == 1:
        return Artifact(found[0], p.name)
    if found:
        raise InputError(f"several Vela artifacts here ({', '.join(n.name for n in found)}): pass one", path)
    raise InputError("no Vela .tflite or raw .npz here (nor a report.json)", path)


def prepare_input(x: np.ndarray, shape: tuple[int, ...], spec: IOSpec | None, where: str) -> np.ndarray:
    """Integer arrays are taken as they are (NHWC); float arrays are quantised from ONNX layout via io.json."""
    if np.issubdtype(x.dtype, np.integer):
        if x.size != int(np.prod(shape)):
            raise InputError(f"{x.size} elements, the artifact's input has shape {list(shape)}", where)
        return x.reshape(shape)
    if not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"unsupported input dtype {x.dtype}", where)
    if spec is None:
        raise InputError("a float input needs a build directory (for its quantisation); pass integers", where)
    if x.ndim != len(spec.perm):
        raise InputError(f"expected a rank-{len(spec.perm)} array in ONNX layout, got shape {list(x.shape)}", where)
    q = spec.to_tosa(x)
    if q.size != int(np.prod(shape)):
        raise InputError(f"{x.size} elements, the artifact's input has shape {list(shape)}", where)
    return q.reshape(shape)
