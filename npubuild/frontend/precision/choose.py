"""The precision stage's work: the plan the spec fixes or the search chooses, applied to the int8 QDQ model.

Writes the mixed QDQ model (the lower stage's input and the TOSA check's reference from here on) and
precision.json: per activation group its precision and layers (with why a group asked for int16 stayed int8),
per weighted layer its weights, and for `precision: auto` the search's measurements (what each choice cost
and bought). Returns the stage's metrics (`precision` in report.json).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from npubuild.config.schema import Calibration, Quantization
from npubuild.fileio import write_bytes, write_json
from npubuild.frontend.data import calibration_arrays
from npubuild.frontend.precision.fixed import fixed_plan
from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.ranges import calibration_ranges
from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan
from npubuild.frontend.precision.search import CostFn, search


def describe(info: QdqModel, plan: PrecisionPlan, kept: dict[str, str]) -> dict:
    """precision.json's per-group and per-layer records, and their counts."""
    def group_record(g) -> dict:  # float where the spec keeps every activation of it so; else its grid's width
        floats = [a for a in g.activations if a in plan.floats]
        whole = len(floats) == len(g.activations)
        record = {"group": g.name, "layers": g.layers,
                  "activations": "float" if whole else "int16" if g.name in plan.int16 else "int8"}
        if floats and not whole:
            record["float_activations"] = floats
        if g.name in kept:
            record["kept_int8"] = kept[g.name]
        return record

    groups = [group_record(g) for g in info.groups.values()]
    int16 = [g for g in groups if g["activations"] == "int16"]  # a group the plan promotes but keeps in float: float
    layers = [{"layer": name, "op_type": layer.op_type, "weights": "int4" if name in plan.int4 else "int8",
               "weight_elements": layer.weight_elements} for name, layer in info.layers.items()]
    return {"groups": groups, "weights": layers,
            "summary": {"int16_groups": len(int16), "groups": len(info.groups),
                        "int4_layers": len(plan.int4), "weighted_layers": len(info.layers),
                        "int16_layers": sorted({lay for g in int16 for lay in g["layers"]}),
                        "int4_weights": sorted(plan.int4),
                        **({"float_layers": sorted({p.name for a in plan.floats
                                                    if (p := info.activations[a].producer) is not None})}
                           if plan.floats else {})}}


def precision_stage(float_path: Path, int8_path: Path, quantization: Quantization, calibration: Calibration,
                    calibration_npy: Path | None, families: Sequence[str], cost: CostFn | None,
                    out_onnx: Path, out_json: Path, host_ops: frozenset[str] | None = None) -> dict:
    """The mixed-precision QDQ model at `out_onnx` and its record at `out_json`; the stage's metrics. `host_ops`:
    what the targets' host CPUs run in float (search's)."""
    int8 = onnx.load(str(int8_path))
    float_model = onnx.load(str(float_path))
    arrays: dict[str, np.ndarray] = calibration_arrays(float_model, calibration.model_dump(), calibration_npy)
    ranges = calibration_ranges(float_model, arrays)
    info = QdqModel(int8)
    record: dict = {"mode": quantization.precision, "families": list(families)}
    if quantization.precision == "auto":
        assert quantization.budget is not None and cost is not None
        plan, found = search(int8, float_model, arrays, families, quantization.budget, cost, ranges, host_ops)
        kept: dict[str, str] = {}
        record["search"] = found
    else:
        plan, kept = fixed_plan(info, quantization, families)
    mixed = apply_plan(int8, plan, families, ranges)
    write_bytes(out_onnx, mixed.SerializeToString())
    record.update(describe(info, plan, kept))
    record["plan"] = plan.to_json()
    write_json(out_json, record)
    summary = {"mode": record["mode"], **record["summary"]}
    if "search" in record:
        s = record["search"]
        summary.update({"met": s["met"], "budget": s["budget"], "int8": s["int8"], "int16": s["int16"],
                        "int16_meets": s.get("int16_meets"),
                        "chosen": s["chosen"], "cycles": s["cycles"], "fits": s["fits"],
                        # what each choice cost (Vela's cycles per target) and bought (the dB it saves)
                        "int16_choices": [g for g in s["groups"] if g["chosen"]],
                        "int4_choices": [lay for lay in s["layers"] if lay["chosen"]],
                        **({"float_tail": s["float_tail"]} if "float_tail" in s else {})})
    return {"precision": summary}
