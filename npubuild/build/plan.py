"""The build plan: builds (spec x model x target) expanded into a graph of stage tasks.

A stage task is identified by the hash of its resolved config (which embeds
its upstream task's hash and the versions of the tools it calls), so builds
that share a model, quantisation and pipeline share their import, quantize,
lower and tosa-check tasks, and a target change touches only that target's
vela and report tasks. Executors (doit, later others) only run this plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from npubuild.config.load import Build
from npubuild.fileio import stable_hash
from npubuild.build.versions import versions

STAGES = ("import", "quantize", "lower", "tosa-check", "vela", "npu-sim", "fvp", "report")
# the module that implements each stage (its source fingerprint is part of the stage's cache key)
STAGE_MODULES = {
    "import": "npubuild.stages.importer",
    "quantize": "npubuild.stages.quantize",
    "lower": "npubuild.stages.lower",
    "tosa-check": "npubuild.stages.tosa_check",
    "vela": "npubuild.stages.vela",
    "npu-sim": "npubuild.stages.npu_sim",
    "fvp": "npubuild.stages.fvp",
    "report": "npubuild.stages.report",
}
STAGE_TOOLS = {
    "import": ("onnx", "onnx-ir"),
    "quantize": ("onnx", "onnxruntime"),
    "lower": ("onnx", "onnx-ir", "tosa-tools"),
    "tosa-check": ("onnx", "onnxruntime", "tosa-tools"),
    "vela": ("ethos-u-vela",),
    "npu-sim": ("ethos-u-vela", "tosa-tools"),
    "fvp": (),  # the FVP binary's size and mtime are in the task's config
    "report": (),
}


@dataclass
class StageTask:
    stage: str
    label: str
    config: dict
    inputs: dict[str, Path]
    outputs: dict[str, Path]
    deps: list[str] = field(default_factory=list)  # names of upstream tasks
    builds: list[str] = field(default_factory=list)

    @cached_property
    def key(self) -> str:  # cached: hashing the config is most of planning time on a big matrix
        return stable_hash(self.config)

    @property
    def name(self) -> str:
        return f"{self.stage}:{self.sub}"

    @property
    def sub(self) -> str:
        return f"{self.label}-{self.key[:8]}" if self.stage != "report" else self.label

    @property
    def dir(self) -> Path:
        return self.outputs["record"].parent


@dataclass
class BuildPlan:
    build_dir: Path
    builds: list[Build]
    tasks: dict[str, StageTask]  # by name, in dependency order
    build_tasks: dict[str, dict[str, str]]  # build id -> stage -> task name
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # build id -> stage -> why it is not run


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path.resolve())


def _task(tasks: dict[str, StageTask], stage: str, label: str, config: dict, inputs: dict[str, Path],
          outputs: dict[str, str], build_dir: Path, deps: list[str], build_id: str) -> StageTask:
    config = {"stage": stage, **config, "versions": versions(STAGE_TOOLS[stage], STAGE_MODULES[stage])}
    key = stable_hash(config)
    if stage == "report":
        d = build_dir / "builds" / label
    else:
        d = build_dir / "stages" / stage / f"{label}-{key[:8]}"
    t = StageTask(stage, label, config, inputs, {k: d / v for k, v in {**outputs, "record": "stage.json"}.items()}, deps)
    existing = tasks.get(t.name)
    if existing is not None:
        existing.builds.append(build_id)
        return existing
    t.builds.append(build_id)
    tasks[t.name] = t
    return t


def make_plan(builds: list[Build], build_dir: Path) -> BuildPlan:
    build_dir = build_dir.resolve()
    tasks: dict[str, StageTask] = {}
    build_tasks: dict[str, dict[str, str]] = {}
    skipped: dict[str, dict[str, str]] = {}
    for b in builds:
        root = b.project_root
        model = b.model
        imp = _task(tasks, "import", b.model_name,
                    {"model": _rel(b.model_path, root), "input_shapes": model.input_shapes},
                    {"model": b.model_path}, {"onnx": "model.onnx"}, build_dir, [], b.id)
        float_model = imp.outputs["onnx"]
        prev = imp
        chain = {"import": imp.name}
        if b.pipeline.profile == "int":
            calib_inputs = {"float": float_model}
            if b.calibration_npy is not None:
                calib_inputs["calibration"] = b.calibration_npy
            quant = _task(tasks, "quantize", b.model_name,
                          {"import": imp.key, "quantization": b.spec.quantization.model_dump(),
                           "calibration": model.calibration.model_dump()},
                          calib_inputs, {"onnx": "model_qdq.onnx"}, build_dir, [imp.name], b.id)
            chain["quantize"] = quant.name
            prev = quant
            lower_in = quant.outputs["onnx"]
        else:
            lower_in = float_model
        lower = _task(tasks, "lower", b.model_name,
                      {"input": prev.key, "pipeline": b.pipeline.model_dump()},
                      {"onnx": lower_in}, {"tosa": "model.tosa", "io": "io.json"}, build_dir, [prev.name], b.id)
        chain["lower"] = lower.name
        if b.spec.verify.tosa:
            check = _task(tasks, "tosa-check", b.model_name,
                          {"lower": lower.key, "verify": b.spec.verify.model_dump(exclude={"fvp"}),
                           "input_shapes": model.input_shapes, "calibration": model.calibration.model_dump(),
                           "evaluation": model.evaluation.model_dump() if model.evaluation else None},
                          {"tosa": lower.outputs["tosa"], "io": lower.outputs["io"], "reference": lower_in,
                           "float": float_model, **({"calibration": b.calibration_npy} if b.calibration_npy else {}),
                           **({"eval_inputs": b.evaluation[0], "eval_labels": b.evaluation[1]}
                              if b.evaluation else {})},
                          {"numerics": "numerics.json", "reference": "reference.npz"}, build_dir, [lower.name], b.id)
            chain["tosa-check"] = check.name
        if b.pipeline.profile == "int":  # Ethos-U runs integer graphs only: an FP build stops at the TOSA check
            vela = _task(tasks, "vela", f"{b.model_name}-{b.target.name}",
                         {"lower": lower.key, "target": b.target.model_dump(), "vela": b.vela.model_dump()},
                         {"tosa": lower.outputs["tosa"]}, {"ini": "system.ini", "summary": "summary.json"},
                         build_dir, [lower.name], b.id)
            chain["vela"] = vela.name
            if b.spec.verify.tosa and b.vela.output_format == "raw":  # npu-sim: the artifact against TOSA
                sim = _task(tasks, "npu-sim", f"{b.model_name}-{b.target.name}",
                            {"vela": vela.key, "accelerator": b.target.accelerator,
                             "output_format": b.vela.output_format,
                             "verify": b.spec.verify.model_dump(exclude={"fvp"}),
                             "calibration": model.calibration.model_dump()},
                            {"vela": vela.outputs["summary"], "tosa": lower.outputs["tosa"], "io": lower.outputs["io"],
                             "float": float_model, **({"calibration": b.calibration_npy} if b.calibration_npy else {})},
                            {"result": "npusim.json"}, build_dir, [vela.name], b.id)
                chain["npu-sim"] = sim.name
        _fvp_task(tasks, b, chain, build_dir, skipped)
        stage_records = {stage: tasks[name].outputs["record"] for stage, name in chain.items()}
        report = _task(tasks, "report", f"{b.spec.name}/{b.model_name}/{b.target.name}",
                       {"build": b.id, "expect": b.spec.expect.model_dump(),
                        "stages": {s: tasks[n].key for s, n in chain.items()}},
                       stage_records, {"entry": "entry.json"}, build_dir, list(chain.values()), b.id)
        chain["report"] = report.name
        build_tasks[b.id] = chain
    return BuildPlan(build_dir, builds, tasks, build_tasks, skipped)


def _fvp_task(tasks: dict[str, StageTask], b: Build, chain: dict[str, str], build_dir: Path,
              skipped: dict[str, dict[str, str]]) -> None:
    """The FVP run of a build, when an FVP and a runner are there (or `required` says to fail without)."""
    from npubuild.ethosu.fvp_select import fvp_decision

    config, runner, reason = fvp_decision(b)
    if config is None:
        skipped.setdefault(b.id, {})["fvp"] = reason or "not run"
        return
    inputs: dict[str, Path] = {}
    if not config.get("error"):
        vela, check = tasks[chain["vela"]], tasks[chain["tosa-check"]]
        inputs = {"vela_summary": vela.outputs["summary"], "io": check.inputs["io"],
                  "reference": check.outputs["reference"], "runner": runner}
        config = {**config, "vela": vela.key, "tosa_check": check.key}
    deps = [chain[s] for s in ("vela", "tosa-check") if s in chain]
    fvp = _task(tasks, "fvp", f"{b.model_name}-{b.target.name}", config, inputs,
                {"log": "uart.log", "result": "fvp.json"}, build_dir, deps, b.id)
    chain["fvp"] = fvp.name
