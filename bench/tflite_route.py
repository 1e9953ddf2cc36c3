"""The route users take today, beside npubuild's: float ONNX -> onnx2tf -> TFLite full int8 -> Vela.

A benchmark script, not part of npubuild (never imported by its tests).
Run it with the Python of a scratch venv that has onnx2tf and its needs:

    python3.11 -m venv /tmp/tflite-venv
    /tmp/tflite-venv/bin/pip install onnx2tf==1.29.24 tensorflow tf_keras onnx_graphsurgeon sng4onnx onnxsim \
        psutil ai_edge_litert onnx onnxruntime
    # onnx2tf 1.29.24's pins resolve this to tensorflow 2.19.0, tf_keras 2.19.0, onnx 1.19.1, onnxruntime 1.23.0
    # (the venv bench/routes.md and bench/real_routes.md were last rendered with: /work/peervenv/tflite)
    npubuild build configs --build-dir /tmp/npb --keep-going   # npubuild's figures (and its Vela .ini files)
    PATH=/tmp/tflite-venv/bin:$PATH python bench/tflite_route.py --report /tmp/npb/report.json \
        --work /tmp/tflite-route --out bench/tflite_route.md

For every build in npubuild's report it converts the same float model
(batch fixed to 1) with onnx2tf to a saved_model, quantises it with the
TFLite converter to full int8 (int8 in and out, calibrated on the same kind
of random data as the spec: uniform [-1, 1], 32 samples, seed 0), measures
the TFLite model's SNR against onnxruntime on the float model, and compiles
it with the same Vela and options npubuild used and Vela's named system config and
memory mode for the target (the ones npubuild's profile mirrors; bench/peer_vela.py).
Vela's per-layer output (--verbose-performance) is kept in --work. --json writes the
route's rows (with compile_s: onnx2tf + converter + Vela) for bench/routes.py.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_vela  # noqa: E402

ONNX2TF_IMAGE_SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"


def static_model(src: Path, dst: Path) -> onnx.ModelProto:
    """Batch 1 everywhere and inferred shapes: onnx2tf mislays NCHW layouts on a symbolic batch dim."""
    m = onnx.load(str(src))
    for vi in list(m.graph.input) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].Clear()
            dims[0].dim_value = 1
    m = onnx.shape_inference.infer_shapes(m)
    onnx.save(m, str(dst))
    return m


def input_shape(m: onnx.ModelProto) -> tuple[str, list[int]]:
    vi = m.graph.input[0]
    return vi.name, [d.dim_value for d in vi.type.tensor_type.shape.dim]


def to_tf_layout(x: np.ndarray, tf_shape: list[int]) -> np.ndarray:
    """onnx2tf turns rank-4 (and rank-3) NC... inputs channel-last; follow it when the shapes say so."""
    if list(x.shape) == list(tf_shape):
        return x
    perm = [0, *range(2, x.ndim), 1]
    y = x.transpose(perm)
    if list(y.shape) != list(tf_shape):
        raise RuntimeError(f"cannot map ONNX input {x.shape} to TF input {tf_shape}")
    return y


def from_tf_layout(y: np.ndarray, onnx_shape: tuple[int, ...]) -> np.ndarray:
    if tuple(y.shape) == tuple(onnx_shape):
        return y
    perm = [0, y.ndim - 1, *range(1, y.ndim - 1)]
    return y.transpose(perm)


def convert(onnx_path: Path, work: Path, samples: int = 32, seed: int = 0) -> Path:
    """onnx2tf saved_model, then the TFLite converter to full int8 with a representative dataset."""
    import tensorflow as tf

    sm = work / "saved_model"
    work.mkdir(parents=True, exist_ok=True)
    # onnx2tf checks image models on a sample it would download; give it local random data instead
    sample = work / ONNX2TF_IMAGE_SAMPLE
    if not sample.exists():
        np.save(sample, np.random.default_rng(0).uniform(0, 1, (20, 128, 128, 3)).astype(np.float32))
    log = work / "onnx2tf.log"
    with open(log, "w") as f:
        # -rtpo Erf: TFLite has no Erf builtin; onnx2tf's documented workaround approximates it
        proc = subprocess.run(["onnx2tf", "-i", str(onnx_path), "-o", str(sm), "-osd", "-n", "-rtpo", "Erf"], cwd=work,
                              stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not (sm / "saved_model.pb").exists():
        raise RuntimeError(f"onnx2tf failed: {last_error(log)}")
    m = onnx.load(str(onnx_path))
    _, shape = input_shape(m)
    loaded = tf.saved_model.load(str(sm))
    sig = loaded.signatures["serving_default"]
    tf_shape = list(next(iter(sig.structured_input_signature[1].values())).shape)
    # the very samples npubuild calibrates on (npubuild.frontend.data.random_arrays with the specs' settings)
    rng = np.random.default_rng(seed)
    batch = rng.uniform(-1, 1, size=(samples, *shape)).astype(np.float32)
    calib = [to_tf_layout(x, tf_shape) for x in batch]

    def representative():
        for x in calib:
            yield [x]

    conv = tf.lite.TFLiteConverter.from_saved_model(str(sm))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    out = work / "model_int8.tflite"
    out.write_bytes(conv.convert())
    return out


def last_error(log: Path) -> str:
    """The last `SomethingError: ...` line of a tool's log (onnx2tf's reason), else where the log is."""
    found = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
             if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln.strip())]
    return found[-1] if found else f"see {log}"


def reason(exc: Exception) -> str:
    """A route's failure in one line of the table: the exception, paths cut to their file names."""
    text = re.sub(r"(/[^\s/:]+)+/([^\s/:]+)", r"\2", " ".join(str(exc).split()))
    if not re.match(r"^[A-Za-z_.]*(Error|Exception): ", text):  # the child's reason comes named already
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= 240 else f"{text[:110]} ... {text[-125:]}"  # the cause is often at the end


def _convert_child(onnx_path: Path, work: Path) -> None:
    try:
        convert(onnx_path, work)
    except Exception as exc:
        (work / "convert_error.txt").write_text(reason(exc))
        raise SystemExit(1) from None


def convert_isolated(onnx_path: Path, work: Path) -> Path:
    """convert() in a fresh interpreter: the TF converter segfaults on some graphs (the unrolled GRU / LSTM
    examples), which must be one failed row, not the end of the run."""
    import multiprocessing

    work.mkdir(parents=True, exist_ok=True)
    (work / "convert_error.txt").unlink(missing_ok=True)
    proc = multiprocessing.get_context("spawn").Process(target=_convert_child, args=(onnx_path, work))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        err = work / "convert_error.txt"
        raise RuntimeError(err.read_text() if err.exists() else f"the TFLite converter crashed (exit {proc.exitcode})")
    return work / "model_int8.tflite"


def tflite_snr(tfl: Path, onnx_path: Path, n: int = 8, seed: int = 1) -> float:
    """SNR (dB) of the int8 TFLite model against onnxruntime on the float ONNX model.

    On the inputs npubuild's tosa-check uses (npubuild.frontend.data.sample_arrays: verify seed + 1000003,
    the specs' 8 samples), so the two routes' quant_snr_db are measured alike.
    """
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(tfl))
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    sess = ort.InferenceSession(str(onnx_path))
    name, shape = input_shape(onnx.load(str(onnx_path)))
    batch = np.random.default_rng(seed + 1_000_003).uniform(-1, 1, size=(n, *shape)).astype(np.float32)
    sig, noise = 0.0, 0.0
    for x in batch:
        ref = sess.run(None, {name: x})[0].astype(np.float64)
        s, z = inp["quantization"]
        xq = np.clip(np.round(to_tf_layout(x, list(inp["shape"])) / s) + z, -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], xq)
        interp.invoke()
        s, z = out["quantization"]
        y = (interp.get_tensor(out["index"]).astype(np.float64) - z) * s
        y = from_tf_layout(y, ref.shape)
        sig += float(np.sum(ref**2))
        noise += float(np.sum((ref - y) ** 2))
    return 10 * np.log10(sig / max(noise, 1e-30))


def vela(tfl: Path, entry: dict, build_dir: Path, out: Path) -> dict:
    """Vela with npubuild's options and Vela's named system config for the build's target (bench/peer_vela.py)."""
    acc = entry.get("accelerator") or entry["target"]
    got = peer_vela.vela(tfl, acc, peer_vela.vela_options(peer_vela.vela_stage_dir(entry, build_dir) / "stage.json"), out)
    return {**got, "sram_kib": round(got["sram_kib"], 2), "offchip_kib": round(got["offchip_kib"], 2),
            "inference_ms": round(got["inference_ms"], 4)}


def tflite_op_cycles(vela_log: Path) -> dict[str, int]:
    """Vela's per-layer cycles (--verbose-performance) summed by the TFLite operator they came from."""
    out: dict[str, int] = {}
    table_rows = False
    for line in vela_log.read_text().splitlines():
        if line.startswith("----"):
            table_rows = True
            continue
        if table_rows and not line.strip():
            table_rows = False
        elif table_rows:
            cols = line.split()
            out[cols[0]] = out.get(cols[0], 0) + int(cols[5])
    return out


def npubuild_op_cycles(entry: dict) -> dict[str, int]:
    """npubuild's per-layer cycles (report.json metrics.layers) summed by the ONNX op type they lower."""
    m = entry.get("metrics", {})
    types = {o["node"]: o["op_type"] for o in m.get("offloads") or []}
    out: dict[str, int] = {}
    for layer in m.get("layers") or []:
        op = types.get(layer.get("onnx_node"), "(unmapped)")
        out[op] = out.get(op, 0) + int(layer["cycles"])
    return out


def cycles_section(items: list[tuple[str, str, dict[str, int], dict[str, int]]]) -> str:
    """Markdown: for each model x target, cycles by operator on each route (where npubuild loses)."""
    lines = ["", "## NPU cycles by operator (Vela per-layer estimates)", ""]
    for model, target, npb, tfl in items:
        fmt_ops = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
        lines.append(f"- {model} / {target}: npubuild {sum(npb.values())} ({fmt_ops(npb)}); "
                     f"TFLite {sum(tfl.values())} ({fmt_ops(tfl)})")
    return "\n".join(lines) + "\n"


def fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table(rows: list[dict]) -> str:
    head = ("| model | target | route | npu_ops | cpu_ops | sram_kib | offchip_kib | inference_ms | "
            "tosa_snr_db | quant_snr_db | transposes |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['target']} | {r['route']} | {fmt(r.get('npu_ops'))} | "
                     f"{fmt(r.get('cpu_ops'))} | {fmt(r.get('sram_kib'))} | {fmt(r.get('offchip_kib'))} | "
                     f"{fmt(r.get('inference_ms'), 4)} | {fmt(r.get('tosa_snr_db'), 1)} | "
                     f"{fmt(r.get('quant_snr_db'), 1)} | {fmt(r.get('transposes'))} |")
    return "\n".join(lines) + "\n"


def side_by_side(rows: list[dict]) -> str:
    """One line per model x target: npubuild's figures / the TFLite route's (rows come in those pairs)."""
    head = ("| model | target | ONNX nodes NPU/CPU (npubuild) | Vela NPU/CPU ops | SRAM KiB | off-chip KiB | "
            "inference ms | tosa_snr_db | quant_snr_db | TRANSPOSE ops |")
    lines = ["Each cell: npubuild / onnx2tf -> TFLite int8 (same Vela, .ini, system config, memory mode).", "",
             head, "|---|---|---|---|---|---|---|---:|---|---|"]

    def pair(a: dict, b: dict, key: str, digits: int = 2) -> str:
        return f"{fmt(a.get(key), digits)} / {fmt(b.get(key), digits)}"

    for a, b in zip(rows[0::2], rows[1::2], strict=True):
        status = "" if a["route"].endswith("(passed)") else f" ({a['route'].split('(', 1)[-1]}"
        tfl_fail = " (TFLite route failed)" if "failed" in b["route"] else ""
        lines.append(f"| {a['model']}{status}{tfl_fail} | {a['target']} | {fmt(a.get('onnx_npu'))}/"
                     f"{fmt(a.get('onnx_cpu'))} | {fmt(a.get('npu_ops'))}/{fmt(a.get('cpu_ops'))} / "
                     f"{fmt(b.get('npu_ops'))}/{fmt(b.get('cpu_ops'))} | {pair(a, b, 'sram_kib')} | "
                     f"{pair(a, b, 'offchip_kib')} | {pair(a, b, 'inference_ms', 4)} | "
                     f"{fmt(a.get('tosa_snr_db'), 1)} | {pair(a, b, 'quant_snr_db', 1)} | {pair(a, b, 'transposes')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, required=True, help="npubuild's report.json")
    ap.add_argument("--models", type=Path, default=Path(__file__).resolve().parents[1] / "configs" / "models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tflite-route"))
    ap.add_argument("--out", type=Path, help="write the markdown table here too")
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--json", type=Path, help="write the TFLite route's rows here (for bench/routes.py)")
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    build_dir = args.report.parent
    rows: list[dict] = []
    converted: dict[str, tuple[Path, float] | str] = {}
    convert_s: dict[str, float] = {}
    cycles: list[tuple[str, str, dict[str, int], dict[str, int]]] = []
    for e in report["builds"]:
        model = e["model"]
        if args.only and model not in args.only:
            continue
        m = e.get("metrics", {})
        rows.append({"model": model, "target": e["target"], "route": f"npubuild ({e['status']})",
                     "npu_ops": m.get("vela_npu_ops"), "cpu_ops": m.get("vela_cpu_ops"),
                     "sram_kib": m.get("sram_kib"), "offchip_kib": m.get("offchip_kib"),
                     "inference_ms": m.get("inference_ms"), "tosa_snr_db": m.get("tosa_snr_db"),
                     "quant_snr_db": m.get("quant_snr_db"), "transposes": m.get("transposes"),
                     "onnx_npu": m.get("npu_ops"), "onnx_cpu": m.get("cpu_ops")})
        work = args.work / model
        if model not in converted:
            try:
                src = args.models / f"{model}.onnx"
                fixed = work / f"{model}.onnx"
                work.mkdir(parents=True, exist_ok=True)
                static_model(src, fixed)
                start = time.perf_counter()
                tfl = convert_isolated(fixed, work)
                convert_s[model] = time.perf_counter() - start
                try:
                    snr: float | str = tflite_snr(tfl, fixed)
                except Exception as exc:  # the route's model exists: its figures stand, its accuracy is unknown
                    snr = reason(exc)
                converted[model] = (tfl, snr)
            except Exception as exc:  # report the route's failure in the table, keep going
                converted[model] = reason(exc)
        got = converted[model]
        row = {"model": model, "target": e["target"], "route": "onnx2tf -> TFLite int8"}
        if isinstance(got, str):
            row["route"] += f" (failed: {got})"
        else:
            try:
                row.update(vela(got[0], e, build_dir, work / f"vela-{e['target']}"))
                row["compile_s"] = round(convert_s[model] + row["vela_s"], 3)  # onnx2tf + converter + Vela
                cycles.append((model, e["target"], npubuild_op_cycles(e),
                               tflite_op_cycles(work / f"vela-{e['target']}" / "vela.log")))
                if isinstance(got[1], str):
                    row["snr_error"] = got[1]
                else:
                    row["quant_snr_db"] = got[1]
                ops = subprocess.run([sys.executable, "-c", TRANSPOSE_COUNT, str(got[0])], capture_output=True,
                                     text=True, check=False).stdout.strip()
                row["transposes"] = int(ops) if ops.isdigit() else None
            except Exception as exc:
                row["route"] += f" (failed: {reason(exc)})"
        rows.append(row)
        print(table(rows[-2:]).splitlines()[-2], flush=True)
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps([r for r in rows if not r["route"].startswith("npubuild")], indent=1))
    md = side_by_side(rows) + cycles_section(cycles)
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


# counts TRANSPOSE ops in a .tflite (run in a subprocess: the analyzer prints a lot)
TRANSPOSE_COUNT = """
import sys
from ai_edge_litert.interpreter import Interpreter
ops = Interpreter(model_path=sys.argv[1])._get_ops_details()
print(sum(1 for o in ops if o['op_name'] == 'TRANSPOSE'))
"""

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
