"""Numerical fidelity per example and per op family, for two revisions of the lowering (issue 21).

    python bench/numerics.py --build-dir /tmp/b [--before 100b37c] [--after WORKTREE] [--samples 8]

Needs a build dir where `npubuild build configs` ran (the import and quantize stages' models are read from
it, so every revision lowers the same QDQ model). Each revision is exported with `git archive` and run in a
child process with PYTHONPATH pointing at it: the lowering is the revision's, the measurement is this
tree's (verify/node_errors is loaded from this file's tree by path, on top of the revision's package).

Per example (whole graph against onnxruntime's QDQ model, DQ -> float op -> Q, as the TOSA check runs
it): max and mean LSB, SNR vs the QDQ model and vs the float model. Per op family (ONNX op type): each
node's own error fed the QDQ model's inputs (max and mean LSB, the fraction of elements off), and the
lowest SNR vs QDQ and vs float of that family's outputs inside the whole graph (debug-numerics). Writes
the table to stdout; bench/numerics.md keeps a run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load_node_errors():
    """This tree's verify/node_errors on top of whatever npubuild is on the path (the revision's)."""
    spec = importlib.util.spec_from_file_location("bench_node_errors", REPO / "npubuild" / "verify" / "node_errors.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _stage_model(build_dir: Path, stage: str, model: str, file: str) -> Path:
    """The newest `stage` output of `model` in the build dir."""
    found = sorted((build_dir / "stages" / stage).glob(f"{model}-*/{file}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"{build_dir}: no {stage} output for {model}: run `npubuild build configs` there first")
    return found[-1]


def measure(build_dir: Path, configs: Path, samples_n: int) -> dict:
    """Runs inside the child: every INT model of the revision's configs/ on its portable lowering."""
    import numpy as np
    import onnx

    from npubuild.config.load import load_spec
    from npubuild.frontend.data import sample_arrays
    from npubuild.lowering.driver import lower_model
    from npubuild.tosa.run import OnnxSession, run_tosa
    from npubuild.verify.debug_numerics import layer_numerics, prepare
    from npubuild.verify.numerics import snr_db

    node_errors = _load_node_errors().node_errors
    out: dict = {"examples": {}, "families": {}}
    seen = set()
    for spec in sorted(configs.glob("*.yaml")):
        for b in load_spec(spec):
            key = f"{b.spec.name}/{b.model_name}"
            if key in seen or b.pipeline.profile != "int":
                continue
            seen.add(key)
            float_model = onnx.load(str(_stage_model(build_dir, "import", b.model_name, "model.onnx")))
            qdq = onnx.load(str(_stage_model(build_dir, "quantize", b.model_name, "model_qdq.onnx")))
            samples = sample_arrays(float_model, b.model.calibration.model_dump(), b.calibration_npy,
                                    samples_n, b.spec.verify.seed)
            model = prepare(qdq, b.pipeline.passes)
            try:
                lowered = lower_model(model, "int")
            except Exception as exc:  # a split model (host nodes): no single graph to measure
                out["examples"][key] = {"skipped": str(exc).splitlines()[0][:80]}
                continue
            ref, flt = OnnxSession(model.SerializeToString()), OnnxSession(float_model.SerializeToString())
            lsb, r_all, t_all, f_all = [], [], [], []
            n = next(iter(samples.values())).shape[0]
            for i in range(n):
                feeds = {k: v[i] for k, v in samples.items()}
                got, r, f = run_tosa(lowered.tosa, lowered, feeds), ref(feeds), flt(feeds)
                for spec_o in lowered.outputs:
                    if not spec_o.quantized:
                        continue
                    name = spec_o.onnx_name
                    lsb.append(spec_o.lsb_error(r[name], got[name]).ravel())
                    r_all.append(np.ravel(r[name]))
                    t_all.append(np.ravel(spec_o.dequantize(got[name])))
                    f_all.append(np.ravel(f[name]))
            e = np.concatenate(lsb)
            tosa, refv = np.concatenate(t_all), np.concatenate(r_all)
            nodes = node_errors(qdq, b.pipeline.passes, samples)
            layers = layer_numerics(qdq, float_model, b.pipeline.passes, "int", samples)["layers"]
            out["examples"][key] = {"max_lsb": float(e.max()), "mean_lsb": float(e.mean()),
                                    "snr_qdq": snr_db(refv, tosa), "snr_float": snr_db(np.concatenate(f_all), tosa),
                                    "worst_node": nodes.worst.to_json() if nodes.worst else None,
                                    "node_max_lsb": nodes.worst.max_error_lsb if nodes.worst else 0.0}
            fam = out["families"]
            for ne in nodes.nodes:
                d = fam.setdefault(ne.op_type, {"max_lsb": 0.0, "sum_mean": 0.0, "count": 0, "max_off": 0.0,
                                                "snr_qdq": None, "snr_float": None})
                d["max_lsb"] = max(d["max_lsb"], ne.max_error_lsb)
                d["sum_mean"] += ne.mean_error_lsb
                d["count"] += 1
                d["max_off"] = max(d["max_off"], ne.mismatched)
            for row in layers:
                d = fam.get(row["op_type"])
                if d is None:
                    continue
                for k, src in (("snr_qdq", "tosa_snr_db"), ("snr_float", "quant_snr_db")):
                    if row.get(src) is not None:
                        d[k] = row[src] if d[k] is None else min(d[k], row[src])
    return out


def _export(rev: str, dest: Path) -> Path:
    """`git archive` of `rev` into dest (a path to a tree is used as it is)."""
    if Path(rev).is_dir():
        return Path(rev)
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "npubuild", "configs", "pipelines", "targets", "dodo.py"], check=True, capture_output=True).stdout
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(dest, filter="data")
    return dest


def run_revision(rev: str, build_dir: Path, samples: int, tmp: Path) -> dict:
    tree = _export(rev, tmp / rev.replace("/", "_"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run([sys.executable, __file__, "--measure", "--build-dir", str(build_dir), "--configs",
                          str(tree / "configs"), "--samples", str(samples)],
                         env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{rev}: the measurement failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout)


def _f(v, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def render(before: dict, after: dict, names: tuple[str, str]) -> str:
    b_name, a_name = names
    lines = [f"## Per example (whole graph vs onnxruntime's QDQ model), {b_name} -> {a_name}", "",
             "| example | max LSB | mean LSB | SNR vs QDQ dB | SNR vs float dB | worst node (own error) |",
             "|---|---:|---:|---:|---:|---|"]
    for key in sorted(set(before["examples"]) | set(after["examples"])):
        b, a = before["examples"].get(key, {}), after["examples"].get(key, {})
        if "skipped" in a or "skipped" in b:
            lines.append(f"| {key} | skipped: {a.get('skipped') or b.get('skipped')} | | | | |")
            continue
        w = a.get("worst_node") or {}
        worst = f"{w.get('node')} ({w.get('op_type')}) {w.get('max_error_lsb', 0):.0f} LSB on {w.get('mismatched', 0):.2%}" if w else "-"
        lines.append(f"| {key} | {_f(b.get('max_lsb'), '.0f')} -> {_f(a.get('max_lsb'), '.0f')} | "
                     f"{_f(b.get('mean_lsb'), '.4f')} -> {_f(a.get('mean_lsb'), '.4f')} | "
                     f"{_f(b.get('snr_qdq'))} -> {_f(a.get('snr_qdq'))} | {_f(b.get('snr_float'))} -> {_f(a.get('snr_float'))} | {worst} |")
    lines += ["", f"## Per op family: each node's own error (fed the QDQ model's inputs), and the lowest SNR of its "
              f"outputs inside the whole graph, {b_name} -> {a_name}", "",
              "| op | nodes | own max LSB | own mean LSB | most elements off | min SNR vs QDQ dB | min SNR vs float dB |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for op in sorted(set(before["families"]) | set(after["families"])):
        b, a = before["families"].get(op, {}), after["families"].get(op, {})

        def mean(d):
            return d["sum_mean"] / d["count"] if d.get("count") else None
        lines.append(f"| {op} | {a.get('count', b.get('count'))} | {_f(b.get('max_lsb'), '.0f')} -> {_f(a.get('max_lsb'), '.0f')} | "
                     f"{_f(mean(b), '.5f')} -> {_f(mean(a), '.5f')} | {_f(b.get('max_off'), '.3%')} -> {_f(a.get('max_off'), '.3%')} | "
                     f"{_f(b.get('snr_qdq'))} -> {_f(a.get('snr_qdq'))} | {_f(b.get('snr_float'))} -> {_f(a.get('snr_float'))} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--before", default="100b37c", help="git revision (or a tree) of the lowering before")
    ap.add_argument("--after", default=str(REPO), help="git revision (or a tree) after: default this tree")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--keep", type=Path, help="a directory to write each revision's measurement to (JSON)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child's side
    ap.add_argument("--configs", type=Path, default=REPO / "configs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        json.dump(measure(args.build_dir.resolve(), args.configs, args.samples), sys.stdout)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="npubuild-numerics-") as tmp:
        for i, rev in enumerate((args.before, args.after)):
            res = run_revision(rev, args.build_dir.resolve(), args.samples, Path(tmp))
            results.append(res)
            if args.keep:  # each revision's measurement as it finishes (a long run is not lost)
                (args.keep / f"{'before' if i == 0 else 'after'}.json").write_text(json.dumps(res))
    before, after = results
    print(render(before, after, (args.before, Path(args.after).name if Path(args.after).is_dir() else args.after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
