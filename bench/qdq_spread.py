"""How far the QDQ model's own SNR against float moves under float32-sized rounding noise, beside the deployed
integer graph's (issue 30: "deployed within 1 dB of the QDQ model's SNR against float").

    python bench/qdq_spread.py --build-dir DIR/build --eval DIR/eval [--samples 32] [--seeds 6] [--only NAME ...]

onnxruntime runs a QDQ model in float32 (DQ -> float op -> Q): where a value lands within ~1e-6 LSB of a
rounding tie its float32 sum picks a side by chance, while the integer graph computes the exact integer and
rounds it once. Per model: the worst output's SNR against the float model on the held-out inputs for
  - the QDQ model on onnxruntime (QDQ semantics, the reference every check uses) and its optimised session
    (onnxruntime's QLinear int8 kernels),
  - the same QDQ model with each activation QuantizeLinear's input multiplied by 1 + eps*u (u uniform in
    [-1, 1] per tensor, eps 1e-7: float32's own rounding, 2^-23 = 1.2e-7) for `--seeds` seeds: equally valid
    executions of the same QDQ model, whose min..max is the spread its figure carries,
  - the deployed integer graph (model.tosa on the TOSA reference model, which npu-sim matches bit for bit).
A model whose spread is wide amplifies last-bit differences: its QDQ figure is one draw, and the deployed
graph is measured against the spread, not the draw. bench/qdq_spread.md keeps a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptq_real import feeds, latest  # noqa: E402

from npubuild.records.lower import LowerRecord  # noqa: E402
from npubuild.tosa.run import OnnxSession, run_tosa  # noqa: E402
from npubuild.verify.numerics import snr_db  # noqa: E402

EPS = 1e-7


def perturbed(qdq: onnx.ModelProto, seed: int, eps: float = EPS) -> onnx.ModelProto:
    """`qdq` with the input of every activation QuantizeLinear scaled by its own 1 + eps*u."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in qdq.graph.initializer}
    graph_inputs = {i.name for i in qdq.graph.input}
    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    nodes = []
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits | graph_inputs:
            c = f"__spread_{len(nodes)}"
            m.graph.initializer.append(numpy_helper.from_array(np.array(1 + eps * rng.uniform(-1, 1), np.float32), c))
            nodes.append(helper.make_node("Mul", [n.input[0], c], [f"{c}_out"]))
            n.input[0] = f"{c}_out"
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def run_all(session, inputs: list[dict], outs: list[str]) -> dict[str, np.ndarray]:
    got = [session(fd) for fd in inputs]
    return {o: np.stack([g[o] for g in got]) for o in outs}


def worst_snr(flt: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    return min(snr_db(flt[o], got[o]) for o in flt if flt[o].dtype.kind == "f")


def measure(build: Path, eval_dir: Path, name: str, samples: int, seeds: int) -> dict:
    imp, quant, low = (latest(build, s, name) for s in ("import", "quantize", "lower"))
    model = onnx.load(str(imp / "model.onnx"))
    path = eval_dir / f"{name}.npy"
    arrays = {"__single__": np.load(path)} if path.exists() else dict(np.load(eval_dir / f"{name}.npz"))
    inputs = feeds(model, {k: v[:samples] for k, v in arrays.items()})
    outs = [o.name for o in model.graph.output]
    qdq = onnx.load(str(quant / "model_qdq.onnx"))
    flt = run_all(OnnxSession(str(imp / "model.onnx")), inputs, outs)
    row = {"model": name, "qdq": worst_snr(flt, run_all(OnnxSession(qdq.SerializeToString()), inputs, outs)),
           "optimised": worst_snr(flt, run_all(OnnxSession(qdq.SerializeToString(), qdq_semantics=False), inputs,
                                               outs))}
    spread = [worst_snr(flt, run_all(OnnxSession(perturbed(qdq, s).SerializeToString()), inputs, outs))
              for s in range(seeds)]
    row["spread"] = (min(spread), float(np.median(spread)), max(spread))
    row["deployed"] = None
    if low is not None and (low / "model.tosa").exists():
        io = LowerRecord.read(low / "io.json")
        tosa = (low / "model.tosa").read_bytes()
        got = [run_tosa(tosa, io, fd) for fd in inputs]
        dep = {s.onnx_name: np.stack([s.dequantize(g[s.onnx_name]) for g in got]) for s in io.outputs}
        row["deployed"] = worst_snr({o: flt[o] for o in dep}, dep)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--eval", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    names = a.only or sorted(p.name.rsplit("-", 1)[0] for p in (a.build_dir / "stages" / "lower").iterdir())
    print(f"| model | QDQ vs float dB | QDQ optimised session | QDQ under eps {EPS:g}: min / median / max "
          "| deployed vs float dB | deployed - QDQ | deployed - spread min |\n|---|---:|---:|---|---:|---:|---:|")
    for name in names:
        r = measure(a.build_dir, a.eval, name, a.samples, a.seeds)
        lo, mid, hi = r["spread"]
        dep = "-" if r["deployed"] is None else f"{r['deployed']:.2f}"
        d1 = "-" if r["deployed"] is None else f"{r['deployed'] - r['qdq']:+.2f}"
        d2 = "-" if r["deployed"] is None else f"{r['deployed'] - lo:+.2f}"
        print(f"| {name} | {r['qdq']:.2f} | {r['optimised']:.2f} | {lo:.2f} / {mid:.2f} / {hi:.2f} | {dep} | {d1} "
              f"| {d2} |", flush=True)


if __name__ == "__main__":
    main()
