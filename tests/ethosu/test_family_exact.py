"""A family whose own lowering takes only exact rewrites (U55's layer-norm forms on the transformer) is checked
bit for bit against model.tosa, in the lower stage and in the TOSA check, and the error it reports is the one
a run of its own graph on every sample measures; a family whose forms round differently (U85's int32
softmax) keeps the tolerance check against the QDQ model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO
from npbtest.ops import calib, quantize_model, single_op_model

from npubuild.cli import main
from npubuild.ethosu.families import CheckCache, check_feeds, lower_families, same_as_whole
from npubuild.frontend.data import sample_arrays
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE
from npubuild.records.lower import LowerRecord
from npubuild.tosa.run import OnnxSession
from npubuild.verify.partitioned import PartitionedModel, WholeGraphCheck, partitioned_numerics, worst_error


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cold compile of the transformer for U55-128 (module-wide: the tests read its stage outputs)."""
    build_dir = tmp_path_factory.mktemp("exact") / "b"
    code = main(["compile", str(REPO / "configs" / "models" / "transformer.onnx"), "--target", "ethos-u55-128",
                 "--build-dir", str(build_dir), "--json"])
    assert code == 0
    return build_dir


def _lower(build_dir: Path) -> tuple[Path, LowerRecord]:
    (io_path,) = build_dir.glob("stages/lower/*/io.json")
    return io_path.parent, LowerRecord.read(io_path)


def _tosa_check_samples(build_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The numerics.json of the build and the very samples its TOSA check ran (same call, same config)."""
    (numerics,) = build_dir.glob("stages/tosa-check/*/numerics.json")
    config = json.loads((numerics.parent / "stage.json").read_text())["config"]
    (float_path,) = build_dir.glob("stages/import/*/model.onnx")
    samples = sample_arrays(onnx.load(str(float_path)), config["calibration"], None, config["verify"]["samples"],
                            config["verify"]["seed"])
    return numerics, samples


def test_exact_family_is_bit_identical_to_model_tosa_on_every_sample_and_reports_the_measured_error(build: Path):
    lower_dir, io = _lower(build)
    rec = io.families["u55"]
    assert FAMILY_OPTIONS["u55"].same_integers and PORTABLE.same_integers
    assert rec.same_as_model_tosa and rec.partitions[0].file == "u55_model.tosa"
    assert (lower_dir / "u55_model.tosa").read_bytes() != (lower_dir / "model.tosa").read_bytes()
    numerics, samples = _tosa_check_samples(build)
    check = json.loads(numerics.read_text())["partitioned"]["u55"]
    assert check["bitexact_samples"] == 1 and check["samples"] == 4
    (qdq_path,) = build.glob("stages/quantize/*/model_qdq.onnx")
    qdq = OnnxSession(qdq_path)
    own = PartitionedModel(lower_dir, rec.partitions, io.outputs)
    whole = PartitionedModel(lower_dir, [io.whole_partition([])], io.outputs)
    worst = 0.0
    for i in range(check["samples"]):
        feeds = {k: v[i] for k, v in samples.items()}
        got, ref = own(feeds), whole(feeds)
        assert all(np.array_equal(got[k], ref[k]) for k in ref)  # on every sample, not only the one compared
        worst = worst_error(own, feeds, qdq(feeds), worst, got)
    assert check["max_error_lsb"] == worst > 0  # the figure a run of the family's graph on every sample gives
    # the lower stage's figure: model.tosa's error on its first check sample, which the family shares
    first = check_feeds(io)[0]
    assert rec.max_error_lsb == worst_error(own, first, qdq(first))


def test_one_differing_element_fails_the_bit_for_bit_comparison(build: Path):
    lower_dir, io = _lower(build)
    (qdq_path,) = build.glob("stages/quantize/*/model_qdq.onnx")
    whole, own_outputs = CheckCache().with_own_run(qdq_path, lower_dir, io, io.families["u55"].partitions[0])
    assert same_as_whole(whole, own_outputs)
    name, values = next(iter(whole.outputs.items()))
    off = values.copy()
    off.flat[0] = off.flat[0] + 1 if off.flat[0] < np.iinfo(off.dtype).max else off.flat[0] - 1
    assert not same_as_whole(replace(whole, outputs={**whole.outputs, name: off}), own_outputs)
    assert not same_as_whole(whole, {**own_outputs, name: off})


def test_the_tosa_check_measures_every_sample_when_the_first_is_not_identical(build: Path):
    lower_dir, io = _lower(build)
    numerics, samples = _tosa_check_samples(build)
    reported = json.loads(numerics.read_text())["partitioned"]["u55"]
    qdq = OnnxSession(next(build.glob("stages/quantize/*/model_qdq.onnx")))
    first = PartitionedModel(lower_dir, [io.whole_partition([])], io.outputs)({k: v[0] for k, v in samples.items()})
    name = next(iter(first))
    wrong = {**first, name: first[name] ^ 1}
    checks = partitioned_numerics(lower_dir, io, samples, qdq, WholeGraphCheck(wrong, 99.0))
    assert checks["u55"].bitexact_samples is None and checks["u55"].samples == 4
    assert checks["u55"].max_error_lsb == reported["max_error_lsb"]  # measured, not model.tosa's (wrong) 99
    exact = partitioned_numerics(lower_dir, io, samples, qdq, WholeGraphCheck(first, 99.0))
    assert exact["u55"].bitexact_samples == 1 and exact["u55"].max_error_lsb == 99.0


def test_a_family_whose_forms_round_differently_keeps_the_tolerance_check(tmp_path: Path):
    assert not FAMILY_OPTIONS["u85"].same_integers  # the int32 softmax for short rows
    model = quantize_model(single_op_model("Softmax", {"x": [1, 4, 16]}, {"y": [1, 4, 16]}, axis=-1),
                           calib("x", [1, 4, 16], low=-4, high=4))
    io, _ = lower_families(model, "int", tmp_path, ["u85"])
    rec = io.families["u85"]
    assert rec.partitions[0].file == "u85_model.tosa" and not rec.same_as_model_tosa
    assert rec.max_error_lsb is not None and rec.max_error_lsb <= 1.0  # vs the QDQ model on the check's samples
    assert "same_as_model_tosa" not in rec.to_json()


def test_a_family_whose_rounding_forms_apply_to_no_node_is_checked_bit_for_bit(tmp_path: Path):
    # a stride-2 conv that never reads the last row and column: U85 widens its kernel with zero taps (an exact
    # rewrite) and has no softmax for its int32 form, so its own graph is compared with model.tosa bit for bit
    w = np.random.default_rng(3).uniform(-1, 1, (3, 2, 2, 2)).astype(np.float32)
    model = quantize_model(single_op_model("Conv", {"x": [1, 2, 5, 5]}, {"y": None}, {"w": w}, strides=[2, 2]),
                           calib("x", [1, 2, 5, 5]))
    io, _ = lower_families(model, "int", tmp_path, ["u85"])
    rec = io.families["u85"]
    assert rec.partitions[0].file == "u85_model.tosa" and rec.same_as_model_tosa
    assert rec.max_error_lsb is not None and rec.max_error_lsb <= 1.0
