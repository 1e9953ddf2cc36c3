"""Do U55, U65 and U85 give the same integers? npu-sim on each family's compiled artifact, the same inputs.

For every model of a build directory with one raw (or .tflite) Vela artifact per family, feeds the same seeded
integer inputs (the artifact's own input shape, the full int8 range) to npu-sim on each, and counts the output
elements that differ from the first family's. Each artifact is already bit-exact against its own family's TOSA
graph (the npu-sim stage); the families' graphs are the portable model.tosa or exact rewrites of it, except the
forms that round differently by design (U85's int32 softmax over short rows: `same_integers` in
lowering/options.py), which this table shows as differences.

    python bench/family_integers.py --build-dir /path/to/build [--samples 2] > bench/family_integers.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from npubuild.config.accelerator import Accelerator
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run
from npubuild.npusim.tflite import load_tflite
from npubuild.records.lower import LowerRecord


def _vela_stage(build_dir: Path, build: dict) -> Path | None:
    return next((build_dir / "stages" / "vela").glob(f"{build['model']}-{build['target']}-*"), None)


def _lower_io(build_dir: Path, build: dict) -> Path:
    """The io.json this build's vela stage was made from (by its sha256 in the stage's inputs.json): a build dir
    may hold several lower stages of one model (other target sets lower other families)."""
    import hashlib

    want = json.loads((_vela_stage(build_dir, build) / "inputs.json").read_text())["inputs"]["io"][2]
    for io in (build_dir / "stages" / "lower").glob(f"{build['model']}-*/io.json"):
        if hashlib.sha256(io.read_bytes()).hexdigest() == want:
            return io
    raise SystemExit(f"no lower stage matches {build['model']}/{build['target']}")


def _artifact(build_dir: Path, build: dict):
    stage = _vela_stage(build_dir, build)
    if stage is None:
        return None
    npzs = sorted(stage.glob("*_vela.npz"))
    if len(npzs) == 1:
        return load_raw(npzs[0])
    tflites = sorted(stage.glob("*_vela.tflite"))
    if len(tflites) == 1:
        models = load_tflite(tflites[0])
        return models[0] if len(models) == 1 else None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=2)
    args = ap.parse_args()
    report = json.loads((args.build_dir / "report.json").read_text())
    by_model: dict[str, list[dict]] = {}
    for b in report["builds"]:
        if b["status"] == "passed" and (b["metrics"].get("npu_partitions") or 0) == 1:
            by_model.setdefault(b["model"], []).append(b)
    print("| model | families | differing output elements vs the first (of all) | why |")
    print("|---|---|---|---|")
    for model, builds in sorted(by_model.items()):
        arts = [(b["accelerator"], _artifact(args.build_dir, b)) for b in builds]
        arts = [(a, m) for a, m in arts if m is not None]
        if len(arts) < 2:
            continue
        specs = {b["accelerator"]: LowerRecord.read(_lower_io(args.build_dir, b)).npu_partitions(
            Accelerator.parse(b["accelerator"]).lowering_family)[0] for b in builds}
        rng = np.random.default_rng(0)
        first = specs[arts[0][0]]
        diffs = {a: 0 for a, _ in arts[1:]}
        total = 0
        for _ in range(args.samples):  # integer codes in ONNX layout, laid out as each family's graph takes them
            codes = {s.onnx_name: rng.integers(np.iinfo(s.dtype).min, np.iinfo(s.dtype).max + 1, s.onnx_shape)
                     for s in first.inputs_io}
            outs = {}
            for accel, m in arts:
                part = specs[accel]
                xs = [np.transpose(codes[s.onnx_name], s.perm).astype(s.dtype) for s in part.inputs_io]
                got = run(m, xs, keep_ofms=False).outputs
                outs[accel] = [s.from_tosa(g.reshape(s.shape)).ravel() for s, g in zip(part.outputs_io, got, strict=True)]
            ref = outs[arts[0][0]]
            total += sum(o.size for o in ref)
            for accel, _ in arts[1:]:
                diffs[accel] += sum(int(np.count_nonzero(g != r)) for g, r in zip(outs[accel], ref, strict=True))
        names = ", ".join(a.removeprefix("ethos-") for a, _ in arts)
        cells = "; ".join(f"{a.removeprefix('ethos-')} {d}" for a, d in diffs.items())
        why = "" if not any(diffs.values()) else "a family form that rounds differently (see lowering/options.py)"
        print(f"| {model} | {names} | {cells} (of {total}) | {why} |", flush=True)


if __name__ == "__main__":
    main()
