"""The lower stage lowers only the families its builds target: the plan merges them into the shared task's key."""

from __future__ import annotations

import json
from pathlib import Path

from npbtest import REPO, run_subprocess

from npubuild.config.load import adhoc_builds, load_spec
from npubuild.engine.plan import make_plan
from npubuild.stages import STAGES

MODEL = REPO / "configs" / "models" / "ds_cnn.onnx"


def _plan(targets: list[str], build_dir: Path):
    return make_plan(adhoc_builds(MODEL, targets, project_root=REPO), build_dir, STAGES)


def _lower(plan) -> list:
    return [t for t in plan.tasks.values() if t.stage == "lower"]


def test_one_lower_task_names_the_union_of_the_targets_families(tmp_path: Path):
    plan = _plan(["ethos-u85-256", "ethos-u55-128", "ethos-u55-64", "ethos-u65-256"], tmp_path)
    (lower,) = _lower(plan)
    assert lower.config["families"] == ["u55", "u65", "u85"]  # sorted, each once; no u85wide
    assert len(lower.builds) == 4
    # every build's downstream tasks embed that one key
    assert {t.config["lower"] for t in plan.tasks.values() if t.stage in ("vela", "tosa-check")} == {lower.key}


def test_the_key_follows_the_family_set_not_the_targets(tmp_path: Path):
    (u55,) = _lower(_plan(["ethos-u55-128"], tmp_path))
    (both_u55,) = _lower(_plan(["ethos-u55-64", "ethos-u55-128"], tmp_path))
    (wide,) = _lower(_plan(["ethos-u85-1024"], tmp_path))
    (u55_u85,) = _lower(_plan(["ethos-u55-128", "ethos-u85-256"], tmp_path))
    (u85_u55,) = _lower(_plan(["ethos-u85-256", "ethos-u55-128"], tmp_path))
    assert u55.config["families"] == ["u55"] and wide.config["families"] == ["u85wide"]
    assert u55.key == both_u55.key  # two U55 sizes lower the same family: the same task
    assert u55_u85.key == u85_u55.key != u55.key  # the order of the targets does not matter; a new family does


def test_one_build_of_a_spec_plans_the_same_lower_task_as_the_whole_spec(tmp_path: Path):
    """debug-numerics and offloads plan one build of a spec: its lower task must be the spec build's own."""
    builds = load_spec(REPO / "configs" / "kws.yaml")
    assert [b.target.name for b in builds] == ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]
    (whole,) = _lower(make_plan(builds, tmp_path, STAGES))
    (alone,) = _lower(make_plan(builds[2:], tmp_path, STAGES))
    assert alone.config["families"] == ["u55", "u65", "u85"] and alone.key == whole.key


def test_tasks_stay_in_build_order(tmp_path: Path):
    plan = _plan(["ethos-u55-128", "ethos-u85-256"], tmp_path)
    stages = [t.stage for t in plan.tasks.values()]
    # the first build's whole chain, then what the second adds (its vela, npu-sim and report)
    assert stages == ["import", "early-fit", "quantize", "lower", "tosa-check", "vela", "npu-sim", "report", "vela",
                      "npu-sim", "report"]
    first, second = plan.build_tasks.values()
    assert list(first) == list(second) == ["import", "early-fit", "quantize", "lower", "tosa-check", "vela", "npu-sim",
                                                   "report"]
    assert first["lower"] == second["lower"] and first["vela"] != second["vela"]


def test_a_one_target_compile_lowers_that_family_only(tmp_path: Path):
    proc = run_subprocess(["compile", str(MODEL), "--target", "ethos-u85-256", "--build-dir", str(tmp_path / "b"),
                           "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)
    io = json.loads((Path(entry["artifacts"]["tosa"]).parent / "io.json").read_text())
    assert list(io["families"]) == ["u85"]
    assert entry["status"] == "passed" and entry["metrics"]["npu_offload"] == 1.0
