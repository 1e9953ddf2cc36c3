"""tosa-check keeps the runs npu-sim would make again (tosa/memo.py, runs.npz): in a real DS-CNN compile the memo
holds the TOSA reference model's outputs of the graph Vela compiled on the first sample and onnxruntime's of the
float and QDQ models on every sample, each equal to a run made now, and npu-sim takes them instead of running
again; a key names what was run (graph or model bytes, every input's dtype, shape and bytes). A damaged runs.npz
reruns tosa-check: tests/engine/test_output_integrity.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tosa_reference_model as trm
from npbtest import REPO, run_subprocess

from npubuild.errors import InternalError
from npubuild.npusim.tflite import load_tflite
from npubuild.npusim.verify import compare, reference_outputs
from npubuild.records.lower import LowerRecord
from npubuild.records.vela import VelaRecord
from npubuild.tosa.memo import RunMemo, graph_key, model_key
from npubuild.tosa.run import OnnxSession, RememberedSession
from npubuild.verify.npu_sim import hold_exact_claim, whole_graph_specs


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("memo")
    proc = run_subprocess(["compile", str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target", "ethos-u55-128",
                           "--json", "--build-dir", "build"], work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(proc.stdout)
    assert entry["stages"]["npu-sim"]["status"] == "passed"
    stages = work / "build" / "stages"
    (check,) = (stages / "tosa-check").iterdir()
    (lower,) = (stages / "lower").iterdir()
    (vela,) = (stages / "vela").iterdir()
    (quantize,) = (stages / "quantize").iterdir()
    (imported,) = (stages / "import").iterdir()
    return {"check": check, "lower": lower, "vela": vela, "qdq": quantize / "model_qdq.onnx",
            "float": imported / "model.onnx"}


def first_sample(build: dict[str, Path]) -> dict[str, np.ndarray]:
    with np.load(build["check"] / "reference.npz") as z:
        return {k.removeprefix("input_"): z[k] for k in z.files if k.startswith("input_")}


def test_the_memo_holds_the_compiled_graphs_first_run_as_the_reference_model_gives_it(build: dict[str, Path]):
    memo = RunMemo.read(build["check"] / "runs.npz")
    io = LowerRecord.read(build["lower"] / "io.json")
    vela = VelaRecord.read(build["vela"] / "summary.json")
    compiled = build["lower"] / vela.partitions[0].tosa  # the graph npu-sim runs (u55_model.tosa here)
    graph = compiled.read_bytes()
    xs = [spec.to_tosa(first_sample(build)[spec.onnx_name]) for spec in io.inputs]
    kept = memo.get(graph_key(graph, xs))
    assert kept is not None, sorted(memo.entries)
    fresh, status = trm.run(graph, xs)
    assert "VALID" in str(status)
    assert len(kept) == len(fresh)
    for i, y in enumerate(fresh):
        y = np.asarray(y)
        assert kept[str(i)].dtype == y.dtype and kept[str(i)].shape == y.shape and np.array_equal(kept[str(i)], y)
    # npu-sim's own lookup gives exactly those arrays; another input is not in the memo (made, not taken)
    assert all(np.array_equal(a, b) for a, b in zip(reference_outputs(graph, xs, memo), fresh, strict=True))
    other = [x.copy() for x in xs]
    other[0].flat[0] ^= 1
    assert memo.get(graph_key(graph, other)) is None


def test_the_memo_answers_the_float_and_qdq_runs_without_a_session(build: dict[str, Path]):
    memo = RunMemo.read(build["check"] / "runs.npz")
    feeds = first_sample(build)
    for model in (build["float"], build["qdq"]):
        remembered = RememberedSession(model, memo)
        got = remembered(dict(feeds))
        assert remembered._session is None  # taken from the memo: no onnxruntime session made
        want = OnnxSession(model)(dict(feeds))
        assert list(got) == list(want)
        assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)


def test_a_key_names_the_bytes_dtype_and_shape_of_what_was_run(tmp_path: Path):
    x = np.arange(6, dtype=np.int8).reshape(2, 3)
    keys = {graph_key(b"g", [x]), graph_key(b"h", [x]), graph_key(b"g", [x.astype(np.int16)]),
            graph_key(b"g", [x.reshape(3, 2)]), graph_key(b"g", [x, x])}
    assert len(keys) == 5 and graph_key(b"g", [x.copy()]) == graph_key(b"g", [x])
    assert model_key(b"m", "a", {"x": x}) != model_key(b"m", "b", {"x": x}) != model_key(b"m", "a", {"y": x})
    memo = RunMemo()
    memo.put("k", {"out/0": x, "b": np.array([True, False])})
    memo.write(tmp_path / "runs.npz")
    back = RunMemo.read(tmp_path / "runs.npz").get("k")
    assert back is not None and list(back) == ["out/0", "b"]
    assert back["out/0"].dtype == np.int8 and np.array_equal(back["out/0"], x) and back["b"].dtype == bool


def test_npu_sim_holds_a_sample_to_the_checked_graphs_kept_run_and_runs_its_own_graph_where_they_differ(
        build: dict[str, Path]):
    """tosa-check keeps model.tosa's runs on every sample, the compiled graph's (a family's bit-identical form)
    on the first only: compare() holds each sample whose npu-sim outputs are model.tosa's kept ones bit for bit
    to those, and runs the compiled graph on the reference model only for a sample that differs from them."""
    io = LowerRecord.read(build["lower"] / "io.json")
    vela = VelaRecord.read(build["vela"] / "summary.json")
    compiled = (build["lower"] / vela.partitions[0].tosa).read_bytes()
    checked = (build["lower"] / "model.tosa").read_bytes()
    assert compiled != checked  # u55_model.tosa: the lower stage's own graph for the family
    (artifact,) = load_tflite(build["vela"] / vela.partitions[0].tflite)
    inputs, outputs = whole_graph_specs(io, vela.partitions[0].tosa)
    assert inputs == io.inputs and outputs == io.outputs  # both graphs take and give the same layout here
    rng = np.random.default_rng(3)
    samples = [[spec.to_tosa(rng.uniform(-1, 1, spec.onnx_shape).astype(np.float32)) for spec in inputs]
               for _ in range(3)]
    kept = []
    for xs in samples:
        outs, status = trm.run(checked, xs)
        assert "VALID" in str(status)
        kept.append([np.asarray(y) for y in outs])
    names = [o.onnx_name for o in outputs]
    memo = RunMemo()

    held = compare(artifact, compiled, samples, names, memo, kept)
    assert held.bitexact and held.held_to_checked == 3 and held.reference_runs == 0

    kept[1][0].flat[0] ^= 1  # the kept run one LSB off on sample 1: that sample runs the compiled graph
    again = compare(artifact, compiled, samples, names, memo, kept)
    assert again.bitexact and again.held_to_checked == 2 and again.reference_runs == 1
    assert held.off_checked == [] and again.off_checked == [1]

    alone = compare(artifact, compiled, samples, names, memo)  # nothing checked kept: the compiled graph runs
    assert alone.bitexact and alone.held_to_checked == 0 and alone.reference_runs == 3
    assert all(np.array_equal(a, b) for x, y in zip(held.outputs, alone.outputs, strict=True)
               for a, b in zip(x, y, strict=True))


def test_a_compiled_graph_claimed_identical_to_model_tosa_that_gives_other_outputs_is_an_internal_error(
        build: dict[str, Path]):
    """The lower stage found u55_model.tosa bit-identical to model.tosa on one random sample; npu-sim compares
    every sample with model.tosa's kept runs anyway, so a sample that breaks the claim (here: the kept run made
    one LSB off) is npubuild's own error, not a passed build; a family not claimed identical may differ."""
    io = LowerRecord.read(build["lower"] / "io.json")
    vela = VelaRecord.read(build["vela"] / "summary.json")
    compiled_file = vela.partitions[0].tosa
    (fam,) = [f for f, rec in io.families.items() if rec.partitions[0].file == compiled_file]
    assert io.families[fam].same_as_model_tosa
    compiled = (build["lower"] / compiled_file).read_bytes()
    (artifact,) = load_tflite(build["vela"] / vela.partitions[0].tflite)
    inputs, outputs = whole_graph_specs(io, compiled_file)
    rng = np.random.default_rng(5)
    samples = [[spec.to_tosa(rng.uniform(-1, 1, spec.onnx_shape).astype(np.float32)) for spec in inputs]
               for _ in range(2)]
    kept = [[np.asarray(y) for y in trm.run((build["lower"] / "model.tosa").read_bytes(), xs)[0]] for xs in samples]
    names = [o.onnx_name for o in outputs]
    hold_exact_claim(io, compiled_file, compare(artifact, compiled, samples, names, RunMemo(), kept))
    kept[0][0].flat[0] ^= 1
    verdict = compare(artifact, compiled, samples, names, RunMemo(), kept)
    assert verdict.bitexact and verdict.off_checked == [0]
    with pytest.raises(InternalError, match=rf"the lower stage found the {fam} graph .* 1 of 2 samples \(first: sample 0\)"):
        hold_exact_claim(io, compiled_file, verdict)
    unclaimed = replace(io, families={**io.families, fam: replace(io.families[fam], same_as_model_tosa=False)})
    hold_exact_claim(unclaimed, compiled_file, verdict)
