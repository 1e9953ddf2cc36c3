"""npubuild beside the TFLite route on the real trained models (shared/models/real): one command, one table.

    PYTHONPATH=. .venv/bin/python bench/real_routes.py --real /work/scratch/perf/real --work /work/scratch/perf/rr \
        --out bench/real_routes.md

A benchmark script, not part of npubuild. --real is a copy of shared/models/real with its calibration made
(`calib/`; its README says how), written to only for the default build dir (--real/build; pass --build-dir to
keep it read-only). --raw holds the original .tflite files at their paths in the wheels (make_real.sh's pinned
`pip download --no-deps` of mediapipe 0.10.14 and pyopen-wakeword 1.1.0, members as in models.json). It
1. builds every spec in --real/specs with npubuild (this checkout, -n 2, --keep-going) into --real/build;
2. makes held-back inputs (bench/real_heldout.py, in --gen-python: make_real.py's own preprocessing, seed 1,
   --heldout-samples per model (32), none of them a calibration sample);
3. makes the TFLite route's int8 model for each (bench/tflite_real.py): from the **original .tflite** where the
   model came as TFLite (MediaPipe, openWakeWord; TFLite's own post-training calibrator, in --tf-python, TF
   2.21), else onnx2tf -> TFLite converter (in --onnx2tf-python, onnx2tf 1.29.24); both calibrated on the spec's
   own calibration file, full int8 with int8 input and output;
4. compiles each with the same Vela 5.2, npubuild's Vela options and Vela's bundled named config for the
   target (bench/peer_vela.py), and npubuild's own TOSA through the same named config (the last column: it
   must equal what npubuild reported through its own .ini);
5. measures accuracy against float on the held-back inputs: npubuild's deployed integer graph (the target
   family's NPU partitions on the TOSA reference model, host partitions on onnxruntime; npu-sim is bit-exact
   with it, checked per build) and the int8 .tflite (TFLite's interpreter), each output dequantised and set
   against onnxruntime on the float ONNX model: SNR in dB of the worst output, pooled over the samples; and,
   paired, on how many samples npubuild's worst output is the closer of the two.

32 held-back samples, not 8: a near-collapse model's pooled SNR is decided by its one or two worst samples
(mp_selfie_segmentation's deployed graph 4.2 dB against TFLite's 5.4 on 8, 7.5 against 4.1 and 9.9 against 4.8
on two other 32-sample draws).

npubuild / TFLite is Vela's inference time ratio; the geometric mean per target family is over the builds where
both routes compiled.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_vela  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]
RAW = Path("/work/scratch/realgen/s/work/raw")


def run(cmd: list[str], log: Path, cwd: Path | None = None, env: dict | None = None) -> int:
    print("+", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env, check=False).returncode


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64).reshape(ref.shape)
    noise = float(np.sum((ref - got) ** 2))
    sig = float(np.sum(ref ** 2))
    return 200.0 if noise == 0 else round(10 * math.log10(max(sig, 1e-30) / noise), 2)


def onnx_input_shapes(path: Path) -> dict[str, list[int]]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input if vi.name not in inits}


def float_outputs(onnx_path: Path, held: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    n = len(next(iter(held.values())))
    outs = [sess.run(names, {k: v[i] for k, v in held.items()}) for i in range(n)]
    return {name: np.stack([o[j] for o in outs]) for j, name in enumerate(names)}


def failure_cause(entry: dict) -> str | None:
    from npubuild.report.brief import failure_cause as cause

    return cause(entry)


def npubuild_outputs(entry: dict, held: dict[str, np.ndarray], cache: dict) -> dict[str, np.ndarray] | None:
    """The target family's deployed integer graph on the held-back inputs, dequantised (None: nothing lowered)."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.records.lower import LowerRecord
    from npubuild.verify.partitioned import PartitionedModel

    io_path = next(iter(Path(p).parent / "io.json" for k, p in entry.get("artifacts", {}).items() if k == "tosa"),
                   None)
    if io_path is None or not io_path.exists():
        return None
    io = LowerRecord.read(io_path)
    fam = Accelerator.parse(entry.get("accelerator") or entry["target"]).lowering_family
    rec = io.families.get(fam)
    parts = (io.whole_partition([n.name for n in io.nodes]),) if rec is None or rec.same_as_model_tosa \
        else rec.partitions
    key = (str(io_path), tuple(p.file for p in parts))
    if key not in cache:
        model = PartitionedModel(io_path.parent, parts, io.outputs)
        n = len(next(iter(held.values())))
        got = [model({k: v[i] for k, v in held.items()}) for i in range(n)]
        cache[key] = {s.onnx_name: np.stack([s.dequantize(g[s.onnx_name]) if s.quantized else g[s.onnx_name]
                                             for g in got]) for s in io.outputs}
    return cache[key]


def accuracy(ref: dict[str, np.ndarray], got: dict[str, np.ndarray] | None) -> float | None:
    if got is None:
        return None
    return min(snr_db(ref[k], got[k]) for k in ref)


def per_sample_snr(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> list[float]:
    """Each sample's SNR of its worst output (the paired view of `accuracy`)."""
    n = len(next(iter(ref.values())))
    return [min(snr_db(ref[k][i], np.asarray(got[k]).reshape(ref[k].shape)[i]) for k in ref) for i in range(n)]


def closer_count(ref: dict[str, np.ndarray], a: dict[str, np.ndarray] | None,
                 b: dict[str, np.ndarray] | None) -> tuple[int, int] | None:
    """On how many samples `a` is closer to float than `b` (ties split by half, rounded down), of how many."""
    if a is None or b is None:
        return None
    sa, sb = per_sample_snr(ref, a), per_sample_snr(ref, b)
    wins = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in zip(sa, sb, strict=True))
    return int(wins), len(sa)


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def tflite_route(name: str, meta: dict, real: Path, work: Path, heldout: Path, args) -> dict:
    """The TFLite route's int8 model of one real model and its outputs on the held-back inputs (cached)."""
    out = work / "tflite" / name
    info_path = out / "info.json"
    held_sha = hashlib.sha256((heldout / f"{name}.npz").read_bytes()).hexdigest()
    if info_path.exists() and "tflite" in args.skip:
        info = json.loads(info_path.read_text())
        if info.get("heldout_sha256") == held_sha:  # outputs on these very inputs (else made again)
            return info
    out.mkdir(parents=True, exist_ok=True)
    spec_calib = next((real / "calib").glob(f"{name}.np*"))
    common = ["--float-onnx", str(real / "onnx" / f"{name}.onnx"), "--calib", str(spec_calib),
              "--eval", str(heldout / f"{name}.npz"), "--outputs", str(out / "outputs.npz"),
              "--work", str(out), "--info", str(info_path)]
    if meta["kind"] == "tflite":
        cmd = [args.tf_python, str(ROOT / "bench" / "tflite_real.py"), "--original", str(args.raw / meta["member"])]
        env = None
    else:
        cmd = [args.onnx2tf_python, str(ROOT / "bench" / "tflite_real.py"), "--onnx", str(real / "onnx" / f"{name}.onnx")]
        env = {**os.environ, "PATH": f"{Path(args.onnx2tf_python).parent}:{os.environ['PATH']}"}
    run(["nice", "-n", "10", *cmd, *common], out / "route.log", env=env)
    info = json.loads(info_path.read_text()) if info_path.exists() else {"error": f"no result, see {out / 'route.log'}"}
    if meta["kind"] == "tflite" and info.get("error"):  # e.g. MediaPipe's custom Convolution2DTransposeBias
        why = info["error"]
        cmd = [args.onnx2tf_python, str(ROOT / "bench" / "tflite_real.py"), "--onnx", str(real / "onnx" / f"{name}.onnx")]
        env = {**os.environ, "PATH": f"{Path(args.onnx2tf_python).parent}:{os.environ['PATH']}"}
        run(["nice", "-n", "10", *cmd, *common], out / "route.log", env=env)
        info = json.loads(info_path.read_text())
        info["route"] = f"onnx2tf (TFLite's calibrator cannot run the original: {why[:90]})"
        if info.get("error"):  # both failed: the note gives both reasons
            info["error"] = f"the original: {why}; onnx2tf: {info['error']}"
    info["heldout_sha256"] = held_sha
    info_path.write_text(json.dumps(info))
    return info


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True, help="writable copy of shared/models/real, calib/ made")
    ap.add_argument("--work", type=Path, default=Path("/work/scratch/perf/rr"))
    ap.add_argument("--out", type=Path, help="write the Markdown here (bench/real_routes.md)")
    ap.add_argument("--build-dir", type=Path, help="npubuild's build dir (default: --real/build)")
    ap.add_argument("--raw", type=Path, default=RAW, help="the originals as extracted from the wheels")
    ap.add_argument("--tf-python", default="/work/scratch/realgen/s/tfvenv/bin/python")
    ap.add_argument("--onnx2tf-python", default="/work/scratch/perf/o2tvenv/bin/python")
    ap.add_argument("--gen-python", default="/work/scratch/realgen/s/venv/bin/python")
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--heldout-samples", type=int, default=32, choices=range(1, 257), metavar="1..256",
                    help="held-back samples per model (32)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["build", "heldout", "tflite"],
                    help="reuse the previous run's results for these steps")
    args = ap.parse_args(argv)
    real, work = args.real.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    build_dir = (args.build_dir or real / "build").resolve()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "build" not in args.skip:
        specs = [str(real / "specs" / f"{m}.yaml") for m in args.only] if args.only else ["specs"]
        run(["nice", "-n", "10", sys.executable, "-m", "npubuild", "build", *specs, "--build-dir", str(build_dir),
             "-n", "2", "--keep-going", "-q"], work / "npubuild.log", cwd=real, env=env)
    heldout = work / "heldout"
    if "heldout" not in args.skip or not heldout.exists():
        run([args.gen_python, str(ROOT / "bench" / "real_heldout.py"), "--real", str(real), "--out", str(heldout),
             "--samples", str(args.heldout_samples)], work / "heldout.log")
    meta = json.loads((real / "models.json").read_text())
    report = json.loads((build_dir / "report.json").read_text())
    names = sorted({e["model"] for e in report["builds"]} & set(args.only or meta))
    rows, notes, ratios = [], [], {}
    cache: dict = {}
    for name in names:
        shapes = onnx_input_shapes(real / "onnx" / f"{name}.onnx")
        with np.load(heldout / f"{name}.npz") as z:  # [samples, *ONNX input shape] (make_real drops batch dims)
            held = {k: z[k].astype(np.float32).reshape(len(z[k]), *shapes[k]) for k in z.files}
        ref = float_outputs(real / "onnx" / f"{name}.onnx", held)
        tfl = tflite_route(name, meta[name], real, work, heldout, args)
        tfl_snr, tfl_out = None, None
        if tfl.get("outputs"):
            with np.load(tfl["outputs"]) as z:
                tfl_out = {k: z[k] for k in z.files}
            tfl_snr = accuracy(ref, tfl_out)
        if tfl.get("error"):
            notes.append(f"- {name}: TFLite route failed: {tfl['error']}")
        for e in sorted((e for e in report["builds"] if e["model"] == name), key=lambda e: TARGETS.index(e["target"])):
            m = e.get("metrics") or {}
            acc = e.get("accelerator") or e["target"]
            row = {"model": name, "origin": meta[name]["kind"], "route": tfl.get("route"), "target": e["target"],
                   "status": e["status"],
                   "npb": {k: m.get(k) for k in ("inference_ms", "sram_kib", "offchip_kib", "cpu_ops")}}
            # a build that fell short only at a gate (the collapse gate) was still compiled: its accuracy and
            # named-config time are measured like a passed one's, and the note says which gate
            compiled = "tosa" in e.get("artifacts", {})
            try:
                got = npubuild_outputs(e, held, cache) if compiled else None
                row["npb"]["snr"] = accuracy(ref, got)
                row["closer"] = closer_count(ref, got, tfl_out)
            except Exception as exc:  # noqa: BLE001 - a row of the table
                notes.append(f"- {name} / {e['target']}: npubuild's graph did not run: {exc}")
                row["npb"]["snr"] = None
            if e["status"] != "passed":
                notes.append(f"- {name} / {e['target']}: npubuild {e['status']}: {(failure_cause(e) or '')[:240]}")
            if tfl.get("tflite"):
                try:
                    opts = peer_vela.vela_options(peer_vela.vela_stage_dir(e, build_dir) / "stage.json")
                    v = peer_vela.vela(Path(tfl["tflite"]), acc, opts, work / "tflite" / name / f"vela-{e['target']}")
                    row["tfl"] = {"inference_ms": v["inference_ms"], "sram_kib": v["sram_kib"],
                                  "offchip_kib": v["offchip_kib"], "cpu_ops": v["cpu_ops"], "snr": tfl_snr}
                except Exception as exc:  # noqa: BLE001
                    notes.append(f"- {name} / {e['target']}: Vela on the TFLite model failed: {exc}")
            row["named_ms"] = peer_vela.build_named_ms(e, build_dir, work / "named") if compiled else None
            a, b = row["npb"].get("inference_ms"), (row.get("tfl") or {}).get("inference_ms")
            if a and b and not row["npb"].get("cpu_ops") and not row["tfl"].get("cpu_ops"):  # NPU time alone on both
                row["ratio"] = a / b
                ratios.setdefault(e["target"].split("-")[1], []).append((row["ratio"], meta[name]["kind"],
                                                                         e["status"] == "passed"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    (work / "rows.json").write_text(json.dumps(rows, indent=1))
    samples = len(next(iter(np.load(heldout / f"{names[0]}.npz").values()))) if names else 0
    md = table(rows, ratios, notes, regenerate_command(args), samples)
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


def regenerate_command(args: argparse.Namespace) -> str:
    """The command line that made this table, with every venv and path flag (their defaults are scratch paths)."""
    flags = [("--real", args.real), ("--work", args.work), ("--build-dir", args.build_dir), ("--raw", args.raw),
             ("--tf-python", args.tf_python), ("--onnx2tf-python", args.onnx2tf_python),
             ("--gen-python", args.gen_python), ("--out", args.out or "bench/real_routes.md")]
    return " ".join(["PYTHONPATH=. /work/main/.venv/bin/python bench/real_routes.py",
                     *(f"{flag} {value}" for flag, value in flags if value is not None)])


def table(rows: list[dict], ratios: dict[str, list[tuple[float, str, bool]]], notes: list[str], command: str,
          samples: int) -> str:
    lines = [f"Regenerate: `{command}` (its docstring says what each route runs and what each venv holds; --real: "
             "a copy of shared/models/real with calib/ made).", "",
             "Each cell: npubuild / TFLite route (from the original .tflite where the model came as TFLite, else "
             "onnx2tf); Vela 5.2, the same options, Vela's named config. SNR: dB against the float model on "
             f"{samples} held-back inputs, worst output, pooled over the inputs; closer: on how many of them "
             "npubuild's worst output is nearer float than the TFLite route's.", "",
             "| model | origin | target | inference ms | npubuild / TFLite | SRAM KiB | off-chip KiB | CPU ops | "
             "SNR vs float dB | closer | named-config ms |", "|---|---|---|---|---:|---|---|---|---|---|---:|"]
    worse_acc = []
    for r in rows:
        a, b = r["npb"], r.get("tfl") or {}

        def pair(k: str, d: int = 2, a=a, b=b) -> str:
            return f"{fmt(a.get(k), d)} / {fmt(b.get(k), d)}"

        named = r.get("named_ms")
        closer = "-" if not r.get("closer") else "{} of {}".format(*r["closer"])
        check = "" if named is None or a.get("inference_ms") is None else (
            f"{named:.4f}" + ("" if abs(named - a["inference_ms"]) < 5e-6 else " (differs!)"))
        origin = r["origin"] + (" (onnx2tf)" if r["origin"] == "tflite" and str(r.get("route")).startswith("onnx2tf")
                                else "")
        lines.append(f"| {r['model']} | {origin} | {r['target']} | {pair('inference_ms', 4)} | "
                     f"{fmt(r.get('ratio'), 3)} | {pair('sram_kib')} | {pair('offchip_kib')} | {pair('cpu_ops')} | "
                     f"{pair('snr', 1)} | {closer} | {check} |")
        if a.get("snr") is not None and b.get("snr") is not None and a["snr"] < b["snr"] - 0.5:
            worse_acc.append(f"- {r['model']} / {r['target']}: {a['snr']:.1f} vs {b['snr']:.1f} dB (npubuild closer "
                             f"on {closer})")
    lines += ["", "Geometric mean of npubuild / TFLite route (inference time) per target family, over the builds "
              "both routes compiled with nothing on the CPU (in brackets: TensorFlow-origin models only; then over "
              "the builds npubuild passed, every gate met):", ""]
    for fam, xs in sorted(ratios.items()):
        tf_only = [x for x, kind, _ in xs if kind == "tflite"]
        ok = [x for x, _, passed in xs if passed]
        lines.append(f"- {fam}: {geomean([x for x, _, _ in xs]):.3f} over {len(xs)} builds, max "
                     f"{max(x for x, _, _ in xs):.3f} ({fmt(geomean(tf_only), 3)} over {len(tf_only)}); passed: "
                     f"{fmt(geomean(ok), 3)} over {len(ok)}, max {fmt(max(ok, default=None), 3)}")
    lines += ["", "Where npubuild's deployed graph is further from float than the TFLite route's (> 0.5 dB):", ""]
    lines += worse_acc or ["- nowhere"]
    if notes:
        lines += ["", "Notes:", ""] + notes
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
