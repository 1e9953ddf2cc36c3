"""npu-sim stage: run the compiled raw artifact on npu-sim and require bit-exact agreement with TOSA.

The same sample inputs as tosa-check, quantised with the graph's input
parameters, go through the TOSA reference model and through npu-sim on
Vela's command stream and weights. Any differing element fails the build,
naming the output, the count and the first NPU op writing a wrong value (npusim.verify.localise
traces the first TOSA result npu-sim does not reproduce). A graph split around host operators has each NPU partition's
artifact checked against its TOSA partition. U55, U65 and U85 artifacts run
alike (npusim.sim.run picks the generation); tflite-format builds, a model
with no NPU partition at all (every node on the host) and features npu-sim does not model (npusim.NotModelled) are reported as skipped
with the reason. A command stream Vela got wrong (npusim.VelaMiscompile: e.g. a U55 elementwise IFM smaller
than its OFM) fails the build with what is wrong in it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild.build.plan import StageTask
from npubuild.errors import StageError
from npubuild.fileio import read_json, write_json
from npubuild.frontend.samples import SampleSource
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import load_raw
from npubuild.npusim.tosa_probe import graph_io
from npubuild.npusim.verify import compare
from npubuild.stages.records import LowerRecord


def run(task: StageTask) -> dict:
    """The npu-sim stage (planned for raw builds: stages/npu_sim.py says why not otherwise)."""
    vela = read_json(task.inputs["vela"])
    io = LowerRecord.read(task.inputs["io"])
    if io.profile != "int":
        raise StageError("npu-sim needs an integer (int profile) TOSA graph")
    graph = vela.get("partition_graph") or []
    if graph and not any(p["kind"] == "npu" for p in graph):
        return _skip(task, "every node runs on the host (no NPU partition): there is no NPU artifact to simulate")
    if vela.get("vela_cpu_ops"):
        return _skip(task, f"Vela left {vela['vela_cpu_ops']} operators on the CPU inside an NPU partition; "
                     "npu-sim verifies what runs on the NPU only")
    try:
        jobs = _jobs(task, vela, io)
        results = [(label, compare(model, tosa, samples, names)) for label, model, tosa, samples, names in jobs]
    except NotModelled as exc:
        return _skip(task, f"the artifact uses what npu-sim does not model yet: {exc.message}")
    mismatches = {f"{label}{k}": {"elements": v, "of": r.elements[k]} for label, r in results
                  for k, v in r.mismatches.items()}
    bad = [(label, r) for label, r in results if not r.bitexact]
    first = bad[0] if bad else None
    metrics = {
        "skipped": False,
        "samples": results[0][1].samples,
        "partitions": len(results),
        "bitexact": not bad,
        "npu_ops": sum(r.npu_ops for _, r in results),
        "sim_seconds": round(sum(r.sim_seconds for _, r in results), 4),
        "mismatches": mismatches,
        "first_bad_sample": first[1].first_bad_sample if first else None,
        "first_bad_op": f"{first[0]}{first[1].first_bad_op.describe()}" if first and first[1].first_bad_op else None,
    }
    write_json(task.outputs["result"], metrics)
    if bad:
        text = ", ".join(f"'{k}' {m['elements']}/{m['of']}" for k, m in mismatches.items() if m["elements"])
        where = f"; first: {metrics['first_bad_op']}" if metrics["first_bad_op"] else ""
        raise StageError(f"npu-sim differs from the TOSA reference model ({jobs[0][1].accelerator}): {text} "
                         f"elements over {metrics['samples']} samples{where}")
    return metrics


def _skip(task: StageTask, reason: str) -> dict:
    metrics = {"skipped": True, "reason": reason}
    write_json(task.outputs["result"], metrics)
    return metrics


def _jobs(task: StageTask, vela: dict, io: LowerRecord) -> list[tuple[str, object, bytes, list, list[str]]]:
    """(label, artifact, TOSA graph, integer samples, output names) per NPU partition (one for a whole graph).

    A whole graph runs tosa-check's samples; the NPU partitions of a split graph run seeded random
    integers over their inputs' full range (bit-exactness must hold for any input).
    """
    vela_dir, lower_dir = task.inputs["vela"].parent, task.inputs["io"].parent
    verify = task.config["verify"]
    parts = [p for p in vela.get("partition_graph") or [] if p["kind"] == "npu"]
    if len(vela.get("partition_graph") or []) <= 1:
        npzs = [a for a in vela.get("artifacts", []) if a.endswith(".npz")]
        if not npzs:
            raise StageError("the vela stage wrote no raw .npz artifact")
        float_model = onnx.load(str(task.inputs["float"]))
        arrays, _ = SampleSource.from_json(task.config["samples_from"]).verification(
            float_model, task.config["calibration"], task.inputs.get("calibration"), task.inputs.get("eval_inputs"))
        n = next(iter(arrays.values())).shape[0]
        samples = [[spec.to_tosa(arrays[spec.onnx_name][i]) for spec in io.inputs] for i in range(n)]
        tosa = lower_dir / (parts[0]["file"] if parts else "model.tosa")
        return [("", load_raw(vela_dir / npzs[0]), tosa.read_bytes(), samples, [o.onnx_name for o in io.outputs])]
    jobs = []
    rng = np.random.default_rng(verify["seed"])
    for p in parts:
        tosa = (lower_dir / p["file"]).read_bytes()
        model = load_raw(vela_dir / f"{Path(p['file']).stem}_vela.npz")
        inputs, outputs = graph_io(tosa)
        samples = [[rng.integers(np.iinfo(t).min, np.iinfo(t).max + 1, shape).astype(t) for _, shape, t in inputs]
                   for _ in range(verify["samples"])]
        jobs.append((f"{Path(p['file']).stem}/", model, tosa, samples, outputs))
    return jobs
