"""`precision: auto` (frontend/precision/search.py) on a model with one sensitive layer, Vela's real cost estimate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.builds import sensitive_conv_model

from npubuild.config.load import default_search_path, load_target
from npubuild.config.schema import PrecisionBudget
from npubuild.ethosu.cost import vela_cost
from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.ranges import calibration_ranges
from npubuild.frontend.precision.rewrite import apply_plan
from npubuild.frontend.precision.search import Measure, search
from npubuild.frontend.quantize import quantize

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory):
    rng = np.random.default_rng(0)
    model = sensitive_conv_model(rng)
    path = tmp_path_factory.mktemp("search") / "float.onnx"
    onnx.save(model, path)
    arrays = {"x": rng.uniform(-1, 1, (16, 1, 3, 8, 8)).astype(np.float32)}
    int8 = quantize(path, arrays, {"per_channel": True, "method": "minmax", "symmetric_activations": False})
    profile, _ = load_target("ethos-u55-128", default_search_path(ROOT), None)

    def cost(model: onnx.ModelProto):
        return {profile.name: vela_cost(model, [], profile, profile.vela)}

    return model, int8, arrays, cost


def test_exactly_the_sensitive_layer_is_promoted(sensitive):
    model, int8, arrays, cost = sensitive
    budget = PrecisionBudget(min_snr_db=30.0, weights_int4=False)
    plan, record = search(int8, model, arrays, ("u55",), budget, cost, calibration_ranges(model, arrays))
    info = QdqModel(int8)
    assert [info.groups[g].layers for g in plan.int16] == [["conv2"]]
    assert record["met"] and record["int8"]["snr_db"] < 10 and record["chosen"]["snr_db"] >= 31
    assert record["groups"][0]["layers"] == ["conv2"] and record["groups"][0]["chosen"]  # the largest loss first
    assert not plan.int4


def test_int4_weights_within_the_budget(sensitive):
    """With int4 allowed the search demotes the layers whose 4 bits cost the budget least, and the plan it returns
    still meets the budget when measured."""
    model, int8, arrays, cost = sensitive
    budget = PrecisionBudget(min_snr_db=25.0)
    ranges = calibration_ranges(model, arrays)
    plan, record = search(int8, model, arrays, ("u55",), budget, cost, ranges)
    assert plan.int4 and record["met"]
    assert Measure(model, arrays)(apply_plan(int8, plan, ("u55",), ranges)).snr_db >= 25.0
    assert {lay["layer"] for lay in record["layers"] if lay["chosen"]} == set(plan.int4)
    assert all(lay["weight_bytes_saved"] > 0 for lay in record["layers"])


def test_a_budget_16_bits_cannot_reach_fails_its_gate_with_the_best_plan(sensitive):
    """A budget past what 16 bits everywhere gives (the int8 weights' limit): the search keeps every group int16
    (Vela's figure for that is within the slowdown), says the budget is out of reach, and the build's
    `quantization.budget` gate fails with the SNR reached."""
    from npubuild.config.gates import evaluate

    model, int8, arrays, cost = sensitive
    budget = PrecisionBudget(min_snr_db=150.0, max_slowdown=10.0, weights_int4=False)
    plan, record = search(int8, model, arrays, ("u55",), budget, cost, calibration_ranges(model, arrays))
    assert plan.int16 == {g["group"] for g in record["groups"]} and not record["met"] and not record["int16_meets"]
    (gate,) = evaluate({}, {"precision": {"met": record["met"], "budget": record["budget"],
                                          "chosen": record["chosen"]}})
    assert gate["name"] == "quantization.budget.min_snr_db" and not gate["ok"]
    assert gate["value"] == record["chosen"]["snr_db"] < 150.0


def test_a_budget_out_of_reach_never_returns_a_plan_worse_than_int8(sensitive):
    """Ranges that miss most of one activation's spread (a calibration set unlike what the model sees) make that
    group's int16 grid clip: every plan promoting it measures worse than int8. With the budget out of reach the
    search returns the closest to float of the plans it measured, never one worse than int8 (it used to take
    every group whenever Vela's figure allowed, whatever that measured)."""
    model, int8, arrays, cost = sensitive
    info = QdqModel(int8)
    ranges = dict(calibration_ranges(model, arrays))
    (clipped,) = [a for g in info.groups.values() if g.layers == ["conv3"] for a in g.activations]
    lo, hi = ranges[clipped]
    ranges[clipped] = (lo / 50, hi / 50)
    budget = PrecisionBudget(min_snr_db=150.0, max_slowdown=10.0, weights_int4=False)
    plan, record = search(int8, model, arrays, ("u55",), budget, cost, ranges)
    assert not record["met"] and record["int16"]["snr_db"] < record["int8"]["snr_db"]  # all-int16 clips
    assert record["chosen"]["snr_db"] >= record["int8"]["snr_db"]
    assert Measure(model, arrays)(apply_plan(int8, plan, ("u55",), ranges)).snr_db == \
        pytest.approx(record["chosen"]["snr_db"], abs=0.01)
