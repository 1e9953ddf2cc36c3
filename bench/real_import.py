"""The sixteen real trained models (../shared/models/real), fixed copies and original files, built for
U55-128, U65-256 and U85-256: what each build's status, NPU share and host work are.

    python bench/real_import.py --real /work/real --originals /work/scratch/realgen/s/work \\
        --work /tmp/real-bench [--baseline /work/real/build/report.json] [--out bench/real_import.md]

--real is a copy of the model set with its calibration made (`calib/`, README there); --originals the
`work/` dir of a make_real.sh run (`raw/`: the files as extracted from the wheels, dynamic dims as
exported; `conv/`: tf2onnx's conversions of the TFLite ones before their shapes were fixed). Neither goes
into this repository. The script assembles one npubuild project in --work: the fixed copies' specs as
the model set has them, and bench/real_originals/*.yaml (the original files with nothing added but
`input_shapes:`) beside copies of the original files; the two Silero originals take the model's `sr`
input, so their calibration is the fixed copies' arrays with sr = 16000 added (what the fixed copies
hold as a constant). Then `npubuild build --keep-going` and a table per build from report.json: status,
npu_offload, the nodes on the host and why, inference ms, TOSA and quantisation SNR; --baseline adds
the status and offload of the same build in an earlier report (the fixed copies at main before).
The silero *_folded copies have no original of their own: theirs are the two Silero originals.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ORIGINALS = HERE / "real_originals"
SILERO_SR = 16000


def _source_of(spec: Path) -> str:
    """The originals-dir path a spec's comment names (make_real.sh's layout), from its model path."""
    name = spec.stem
    model = next(line.split("path:", 1)[1].strip() for line in spec.read_text().splitlines() if "path:" in line)
    file = Path(model).name
    return f"raw/**/{file}" if not name.startswith(("mp_", "oww_")) else f"conv/{file}"


def assemble(real: Path, originals: Path, work: Path) -> list[Path]:
    """The project in `work`: fixed specs in specs/, original specs in originals/specs; returns both dirs."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "pyproject.toml").touch()
    for sub in ("onnx", "calib", "specs"):
        if (work / sub).exists():
            shutil.rmtree(work / sub)
        shutil.copytree(real / sub, work / sub)
    orig = work / "originals"
    for sub in ("onnx", "specs"):
        (orig / sub).mkdir(parents=True, exist_ok=True)
    (orig / "calib").unlink(missing_ok=True) if (orig / "calib").is_symlink() else None
    if not (orig / "calib").exists():
        os.symlink("../calib", orig / "calib")
    for spec in sorted(ORIGINALS.glob("*.yaml")):
        found = sorted(originals.glob(_source_of(spec)))
        if not found:
            raise SystemExit(f"{spec.name}: no {_source_of(spec)} under {originals}")
        shutil.copy2(found[0], orig / "onnx" / found[0].name)
        shutil.copy2(spec, orig / "specs" / spec.name)
    for name in ("silero_vad_16k", "silero_vad_ifless"):
        arrays = dict(np.load(real / "calib" / f"{name}.npz"))
        n = len(next(iter(arrays.values())))
        arrays["sr"] = np.full((n,), SILERO_SR, np.int64)
        np.savez(work / "calib" / f"{name}_with_sr.npz", **arrays)
    return [work / "specs", orig / "specs"]


def _host_work(b: dict) -> str:
    """The nodes a build runs on the host, by op type (metrics.offloads, kind 'cpu')."""
    host = [o for o in (b.get("metrics") or {}).get("offloads") or [] if o.get("kind") != "npu"]
    ops: dict[str, int] = {}
    for o in host:
        ops[o.get("op_type", "?")] = ops.get(o.get("op_type", "?"), 0) + 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(ops.items()))


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def table(report: dict, baseline: dict | None) -> str:
    before = {(b["model"], b["target"]): b for b in (baseline or {}).get("builds", [])}
    rows = ["| model | file | target | status | npu_offload | host nodes | ms | TOSA SNR dB | quant SNR dB | before |",
            "|---|---|---|---|---:|---|---:|---:|---:|---|"]
    for b in sorted(report["builds"], key=lambda b: (b["model"], "original" in b["spec"], b["target"])):
        m = b.get("metrics") or {}
        kind = "original" if b["spec"].endswith("_original") else "fixed"
        old = before.get((b["model"], b["target"])) if kind == "fixed" else None
        was = f"{old['status']} {_fmt((old.get('metrics') or {}).get('npu_offload'))}" if old else ""
        err = f" ({b['errors'][0][:80]})" if b.get("errors") else ""
        rows.append(f"| {b['model']} | {kind} | {b['target']} | {b['status']}{err} | {_fmt(m.get('npu_offload'))} | "
                    f"{_host_work(b)} | {_fmt(m.get('inference_ms'), '.4g')} | {_fmt(m.get('tosa_snr_db'), '.1f')} | "
                    f"{_fmt(m.get('quant_snr_db'), '.1f')} | {was} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--originals", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("-n", "--jobs", default="2")
    args = ap.parse_args()
    dirs = assemble(args.real.resolve(), args.originals.resolve(), args.work.resolve())
    cmd = [sys.executable, "-m", "npubuild", "build", *map(str, dirs), "--build-dir", str(args.work / "build"),
           "--keep-going", "-q", "-n", args.jobs]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=args.work, check=False)
    report = json.loads((args.work / "build" / "report.json").read_text())
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    text = table(report, baseline)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
