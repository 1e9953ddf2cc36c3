"""The lower stage's tolerance check (ethosu/families.check_partitioned) runs a few real rows of the spec's
calibration file besides its seeded random samples (issue 33: random inputs miss what real data reaches, a
rounding tie on a whole plane's mean), reading only those rows, and the file is an input of the lower task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO
from npbtest.lowering import conv_model, model_of
from npbtest.ops import calib, quantize_model, single_op_model
from onnx import helper, numpy_helper

from npubuild.config.load import load_specs
from npubuild.engine.cache import cache_key
from npubuild.engine.plan import make_plan
from npubuild.errors import StageError
from npubuild.ethosu.families import (
    MAX_PARTITION_LSB,
    REAL_CHECK_ROWS,
    CheckCache,
    Lowerings,
    family_split,
    lower_families,
    real_feeds,
)
from npubuild.fileio import file_hash
from npubuild.frontend.data import load_arrays, spread_rows
from npubuild.records.lower import LowerRecord, Where
from npubuild.stages import STAGES
from npubuild.tosa.run import OnnxSession
from npubuild.verify.partitioned import PartitionedModel, worst_error


def test_spread_rows_are_the_first_and_last_and_never_more_than_the_file_has():
    assert spread_rows(24, 2) == [0, 23]
    assert spread_rows(5, 3) == [0, 2, 4]
    assert spread_rows(1, 2) == [0] and spread_rows(0, 2) == [] and spread_rows(5, 0) == []


@pytest.mark.parametrize("batch_axis", [True, False])
def test_load_arrays_reads_only_the_spread_rows_of_an_npy_file(tmp_path: Path, batch_axis: bool):
    """Rows as load_arrays reads the whole file gives them, in either accepted form ([N, 1, 3] or [N, 3] for a
    batch-1 input of [1, 3]); the file is mapped, not read (a truncated tail past the rows is never touched)."""
    model = single_op_model("Relu", {"x": [1, 3]}, {"y": [1, 3]})
    rows = np.arange(30, dtype=np.float32).reshape(10, 1, 3)
    np.save(tmp_path / "cal.npy", rows if batch_axis else rows[:, 0])
    whole = load_arrays(tmp_path / "cal.npy", model)["x"]
    got = load_arrays(tmp_path / "cal.npy", model, rows=2)["x"]
    assert got.shape == (2, 1, 3) and np.array_equal(got, whole[[0, 9]])
    assert isinstance(got, np.ndarray) and not isinstance(got, np.memmap)  # a copy: the file is closed after


def test_load_arrays_rows_of_an_npz_file_with_other_arrays(tmp_path: Path):
    model = single_op_model("Add", {"a": [2], "b": [2]}, {"y": [2]})
    a, b = np.arange(12, dtype=np.float32).reshape(6, 2), -np.arange(12, dtype=np.float32).reshape(6, 2)
    np.savez(tmp_path / "cal.npz", a=a, b=b, note=np.zeros(3))
    got = load_arrays(tmp_path / "cal.npz", model, rows=2)
    assert np.array_equal(got["a"], a[[0, 5]]) and np.array_equal(got["b"], b[[0, 5]])
    feeds = real_feeds(tmp_path / "cal.npz", model)
    assert len(feeds) == REAL_CHECK_ROWS and all(set(f) == {"a", "b"} for f in feeds)  # the model's inputs only
    assert np.array_equal(feeds[1]["b"], b[5])


def test_real_feeds_are_the_first_and_last_rows_of_the_calibration_file(tmp_path: Path):
    model = single_op_model("Relu", {"x": [1, 3]}, {"y": [1, 3]})
    rows = np.arange(15, dtype=np.float32).reshape(5, 1, 3)
    np.save(tmp_path / "cal.npy", rows)
    got = real_feeds(tmp_path / "cal.npy", model)
    assert [f["x"].tolist() for f in got] == [rows[0].tolist(), rows[4].tolist()]
    np.save(tmp_path / "one.npy", rows[:1])
    assert len(real_feeds(tmp_path / "one.npy", model)) == 1
    assert real_feeds(None, model) == []


@pytest.mark.parametrize(("spec", "npy"), [("digits", True), ("host_fallback", False)])
def test_the_lower_task_reads_the_calibration_file_where_the_spec_has_one(tmp_path: Path, spec: str, npy: bool):
    """The file is an input of the lower task, so its content is in the task's cache key (cache_key hashes every
    input); its config, and so the stage directory and every later key, is what it was. A spec calibrating
    on random values has no file to give."""
    builds = load_specs([REPO / "configs" / f"{spec}.yaml"])
    lowers = [t for t in make_plan(builds, tmp_path / "build", STAGES).tasks.values() if t.stage == "lower"]
    assert lowers and all(b.calibration_npy is not None for b in builds) == npy
    for task in lowers:
        assert task.inputs.get("calibration") == (builds[0].calibration_npy if npy else None)
        assert "calibration" not in task.config
    if npy:  # the file's content moves the lower task's cache key: one value changed is another key
        task = lowers[0]
        other = tmp_path / "other.npy"
        data = task.inputs["calibration"].read_bytes()
        other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        inputs = {**task.inputs, "calibration": other}
        onnx_hash = {"onnx": "0" * 64}  # the QDQ model is not made here: its hash stands in
        keys = {cache_key(task.config, i, {**onnx_hash, "calibration": file_hash(i["calibration"])})
                for i in (task.inputs, inputs)}
        assert len(keys) == 2


C, H = 16, 64  # a whole-plane mean of 4096 values per channel: U55 lowers it its own way, U65 as model.tosa does


def _mean_then_threshold() -> onnx.ModelProto:
    """x -> whole-plane mean -> a threshold (GreaterOrEqual, Where: no TOSA GREATER / SELECT on U55 and U65, so
    their split runs it on the host, U85 runs model.tosa whole), quantized on inputs in [-3, 1] (zero point 63)."""
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], name="w_in", kernel_shape=[1, 1]),
             helper.make_node("AveragePool", ["a"], ["b"], name="mean", kernel_shape=[H, H]),
             helper.make_node("MaxPool", ["b"], ["c"], name="w_out", kernel_shape=[1, 1]),
             helper.make_node("GreaterOrEqual", ["c", "t"], ["cond"], name="ge"),
             helper.make_node("Where", ["cond", "hi", "c"], ["y"], name="where")]
    inits = {"t": np.array(100.0, np.float32), "hi": np.zeros([1, C, 1, 1], np.float32)}
    return quantize_model(model_of(nodes, {"x": [1, C, H, H]}, {"y": [1, C, 1, 1]}, inits),
                          calib("x", [1, C, H, H], low=-3.0, high=1.0))


def _calibration_with_a_tie(io: LowerRecord, path: Path) -> dict[str, np.ndarray]:
    """A calibration file of two rows, what real images are to the mean: an ordinary one (uniform, as the
    random samples) and a flat one, each plane half k and half k + 1 below the zero point, a rounding tie
    for every channel's mean (TOSA's AVG_POOL2D rounds it away from zero, the QDQ model otherwise on some).
    Returns the tie row."""
    spec = io.inputs[0]
    zp, scale = int(spec.zero_point), spec.scale
    k = round(-1 / scale) - 1  # near the calibrated mean, -1
    q = np.empty((1, C, H, H), np.int64)
    for c in range(C):
        q[0, c] = np.repeat([zp + k - c % 2, zp + k + 1 - c % 2], H * H // 2).reshape(H, H)
    tie = ((q - zp) * scale).astype(np.float32)
    ordinary = np.random.default_rng(5).uniform(-3, 1, (1, C, H, H)).astype(np.float32)
    np.save(path, np.stack([ordinary, tie]))
    return {spec.onnx_name: tie}


@pytest.fixture(scope="module")
def tie_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Path, Path, dict[str, np.ndarray]]:
    """The model, its QDQ form saved, and a calibration file whose last row is the tie."""
    d = tmp_path_factory.mktemp("tie")
    model = _mean_then_threshold()
    io, _ = lower_families(model, "int", d / "probe", [])
    tie = _calibration_with_a_tie(io, d / "cal.npy")
    onnx.save(model, d / "qdq.onnx")
    return model, d / "qdq.onnx", d / "cal.npy", tie


def _error_on(lower_dir: Path, io: LowerRecord, partitions, qdq: Path, feeds: dict[str, np.ndarray]) -> float:
    return worst_error(PartitionedModel(lower_dir, partitions, io.outputs), feeds, OnnxSession(qdq)(feeds))


def test_the_recorded_error_covers_the_real_rows(tmp_path: Path, tie_model):
    """U55's split (its own lowering, the threshold on the host): 0 LSB from the QDQ model on the random samples,
    4 on the calibration file's tie row; recorded with the rows, and allowed, being model.tosa's own error
    there (the baseline of a family lowered its own way)."""
    model, qdq, calibration, tie = tie_model
    random_only, _ = lower_families(model, "int", tmp_path / "random", ["u55"])
    lower_dir = tmp_path / "real"
    with_rows, _ = lower_families(model, "int", lower_dir, ["u55"], calibration=calibration)
    rec = with_rows.families["u55"]
    assert [p.kind for p in rec.partitions] == [Where.NPU, Where.HOST]
    assert random_only.families["u55"].max_error_lsb == 0.0  # what the random samples alone recorded
    on_tie = _error_on(lower_dir, with_rows, rec.partitions, qdq, tie)
    whole_on_tie = _error_on(lower_dir, with_rows, [with_rows.whole_partition([])], qdq, tie)
    assert rec.max_error_lsb == on_tie == whole_on_tie > MAX_PARTITION_LSB


def test_a_split_of_model_tosa_is_allowed_model_tosa_own_error_on_a_real_row(tmp_path: Path, tie_model):
    """U65's split runs model.tosa's own lowering on the NPU: 0 LSB on the random samples, 4 on the tie row, all of
    it model.tosa's own error there (tosa-check's to measure and gate), so it is held to that + MAX_PARTITION_LSB
    as a family lowered its own way is, not refused (it was, with no baseline)."""
    model, qdq, calibration, tie = tie_model
    io, _ = lower_families(model, "int", tmp_path / "random", ["u65"])
    assert [p.file for p in io.families["u65"].partitions] == ["u65_part0.tosa", "u65_host1.onnx"]
    assert io.families["u65"].max_error_lsb == 0.0
    lower_dir = tmp_path / "real"
    with_rows, _ = lower_families(model, "int", lower_dir, ["u65"], calibration=calibration)
    rec = with_rows.families["u65"]
    whole_on_tie = _error_on(lower_dir, with_rows, [with_rows.whole_partition([])], qdq, tie)
    assert rec.max_error_lsb == whole_on_tie > MAX_PARTITION_LSB


def _weights_negated(model: onnx.ModelProto) -> onnx.ModelProto:
    """The QDQ model with its conv's int8 weights negated: what a wrong lowering would run in their place."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    (weights,) = [i for i in wrong.graph.initializer
                  if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 4]
    q = numpy_helper.to_array(weights).astype(np.int16)
    weights.CopyFrom(numpy_helper.from_array(np.clip(-q, -127, 127).astype(np.int8), weights.name))
    return wrong


@pytest.mark.parametrize("fam", ["u55", "u85"])
def test_a_family_graph_that_is_off_the_qdq_model_is_refused(tmp_path: Path, fam: str):
    """The refusal path of the tolerance check: a family whose own graph is wrong (its conv's weights negated, as
    a faulty lowering would make it) is neither taken as bit-identical to model.tosa nor allowed within model.tosa's
    error + MAX_PARTITION_LSB: the stage fails with one line naming the family. The same call with the model's
    own lowering passes (the control: the refusal comes from the wrong graph, not from the setup)."""
    model = quantize_model(conv_model([1, 8, 16, 16], 8, 3), calib("x", [1, 8, 16, 16]))
    io, _ = lower_families(model, "int", tmp_path, [])
    right = Lowerings(model, "int", {})
    rec = family_split(model, right.portable(), io, fam, tmp_path, tmp_path / "qdq.onnx", CheckCache(), right)
    assert rec.max_error_lsb is None or rec.max_error_lsb <= MAX_PARTITION_LSB
    wrong = Lowerings(_weights_negated(model), "int", {})
    with pytest.raises(StageError, match=rf"^error: the {fam} partitioned model differs from the whole model by \d+ LSB$"):
        family_split(model, right.portable(), io, fam, tmp_path, tmp_path / "qdq.onnx", CheckCache(), wrong)
