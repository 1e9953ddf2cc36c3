"""`optimise: size` in a spec or a target profile: Vela's --optimise Size (unless `vela: {optimise}` says
otherwise in the spec) and a lower task of its own whose measured family choices go by memory; the default adds nothing to
any stage's config (performance builds keep their keys)."""

from __future__ import annotations

from pathlib import Path

from npbtest import REPO

from npubuild.config.load import load_specs
from npubuild.engine.plan import make_plan
from npubuild.stages import STAGES


def _plan(project: Path, extra: str, targets: str = "[ethos-u55-128]"):
    spec = project / "configs" / "kws.yaml"
    text = (REPO / "configs" / "kws.yaml").read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("targets:")]
    spec.write_text("\n".join(lines) + f"\ntargets: {targets}\n{extra}")
    builds = load_specs([spec])
    return builds, make_plan(builds, project / "build", STAGES)


def _configs(plan, stage: str) -> list[dict]:
    return [t.config for t in plan.tasks.values() if t.stage == stage]


def test_size_mode_asks_vela_for_size_and_lowers_on_its_own_task(project: Path):
    default_builds, default = _plan(project, "")
    assert default_builds[0].optimise == "performance" and default_builds[0].vela.optimise == "Performance"
    assert all("optimise" not in c for c in _configs(default, "lower"))
    size_builds, size = _plan(project, "optimise: size\n")
    assert size_builds[0].optimise == "size" and size_builds[0].vela.optimise == "Size"
    assert [c["optimise"] for c in _configs(size, "lower")] == ["size"]
    assert {c["vela"]["optimise"] for c in _configs(size, "vela")} == {"Size"}
    # an explicit Vela setting wins over the mode's default
    explicit, _ = _plan(project, "optimise: size\nvela: {optimise: Performance}\n")
    assert explicit[0].optimise == "size" and explicit[0].vela.optimise == "Performance"


def test_a_target_profile_can_ask_for_size(project: Path):
    (project / "targets").mkdir()
    (project / "targets" / "small.yaml").write_text("extends: ethos-u55-128\nname: small\noptimise: size\n")
    builds, plan = _plan(project, "", "[small, ethos-u85-256]")
    modes = {b.target.name: (b.optimise, b.vela.optimise) for b in builds}
    assert modes == {"small": ("size", "Size"), "ethos-u85-256": ("performance", "Performance")}
    assert sorted(c.get("optimise", "performance") for c in _configs(plan, "lower")) == ["performance", "size"]
