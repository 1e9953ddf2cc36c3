"""`npubuild debug-numerics SPEC --model M --target T`: per-node error of the TOSA graph, first jump marked.

The result goes to builds/<spec>/<model>/<target>/layers.json; the next report of the build (any
`npubuild build`, even one with nothing to do) shows it while the lowering is unchanged. The project's
report.json, report.md/html and run.json are not touched.
"""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import InputError, StageError


def cmd_debug_numerics(args) -> int:
    import onnx

    from npubuild.config.load import load_spec
    from npubuild.engine.execute import read_error
    from npubuild.engine.run import RunOptions
    from npubuild.engine.uptodate import read_record
    from npubuild.fileio import write_json
    from npubuild.frontend.data import load_arrays, sample_arrays, subset
    from npubuild.report.run import RunReports, build_and_report
    from npubuild.stages import STAGES
    from npubuild.verify.debug_numerics import layer_numerics, render_table

    builds = load_spec(Path(args.spec))
    chosen = [b for b in builds if (args.model is None or b.model_name == args.model)
              and (args.target is None or b.target.name == args.target)]
    if len(chosen) != 1:
        known = ", ".join(f"--model {b.model_name} --target {b.target.name}" for b in builds)
        what = "matches no build" if not chosen else "matches several builds"
        raise InputError(f"--model/--target {what} of this spec (builds: {known})", args.spec)
    b = chosen[0]
    build_dir = build_dir_of(args)
    result = build_and_report([b], build_dir, STAGES, RunOptions(quiet=True, debug=args.debug),
                              RunReports(None, summary=False))
    chain = result.plan.build_tasks[b.id]
    stage_in = next(s for s in ("precision", "quantize", "import") if s in chain)
    for stage in ("import", stage_in):
        task = result.plan.tasks[chain[stage]]
        if read_record(task) is None:
            err = read_error(task) or {"message": "did not run"}
            raise StageError(f"{b.id}: stage {stage} failed, nothing to compare: {err['message']}")
    float_path = result.plan.tasks[chain["import"]].outputs["onnx"]
    lower_in = result.plan.tasks[chain[stage_in]].outputs["onnx"]
    float_model = onnx.load(str(float_path))
    reference = _float_reference(result.plan, chain, float_model)
    v = b.spec.verify
    if b.evaluation is not None:  # real data with real variety (calibration data may be the problem)
        samples = subset(load_arrays(b.evaluation.inputs, float_model), args.samples or v.samples, v.seed)
    else:
        samples = sample_arrays(float_model, b.model.calibration.model_dump(), b.calibration_npy,
                                args.samples or v.samples, v.seed)
    res = layer_numerics(onnx.load(str(lower_in)), reference, b.pipeline.passes, b.pipeline.profile, samples)
    res["build"] = b.id
    lower_rec = read_record(result.plan.tasks[chain["lower"]]) or {}
    res["lower_key"] = lower_rec.get("cache_key")  # the report keeps this while the lowering's inputs are the same
    out = build_dir / "builds" / b.id / "layers.json"
    write_json(out, res)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{b.id}: {res['samples']} samples, {b.pipeline.profile} profile (written to {out})")
        print(render_table(res))
    return 0


def _float_reference(plan, chain: dict[str, str], float_model):
    """The float model whose tensors the QDQ model's approximate: the import's, or its equalised copy where the
    quantize stage equalised. Cross-layer equalisation divides each channel between two layers by its own
    factor (the graph's outputs stay the same), so against the import's model those tensors measured the
    factors, not the quantisation: -3.7 dB on mp_selfie_segmentation's first Relu against 26+ dB around it."""
    from npubuild.engine.uptodate import read_record
    from npubuild.frontend.ptq.equalize import equalise
    from npubuild.frontend.quantize import calibration_rows
    from npubuild.stages.quantize import QuantizeConfig

    if "quantize" not in chain:
        return float_model
    task = plan.tasks[chain["quantize"]]
    recipe = ((read_record(task) or {}).get("metrics") or {}).get("quantization") or {}
    if not recipe.get("equalization"):
        return float_model
    config = QuantizeConfig.from_json(task.config)
    rows = calibration_rows(float_model, config.calibration, task.inputs.get("calibration"), config.held_back)
    return equalise(float_model, rows)[0]


MAX_SAMPLES = 1000  # the spec's own bound for verify.samples (config/schema.py's Verify)


def _samples(text: str) -> int:
    """1 to MAX_SAMPLES: a count that allocates its inputs up front is bounded (10^9 asked for 1.78 TiB)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if not 1 <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and {MAX_SAMPLES} (verify.samples' range)")
    return value


def register(sub) -> None:
    d = sub.add_parser("debug-numerics", help="per-node error of the TOSA graph vs onnxruntime; marks the first jump")
    d.add_argument("spec", metavar="SPEC", help="the compile spec")
    d.add_argument("--model", help="model name in the spec (needed if it has several)")
    d.add_argument("--target", help="target name in the spec (needed if it has several)")
    add_build_dir(d)
    d.add_argument("--samples", type=_samples, help=f"number of inputs, 1 to {MAX_SAMPLES} (default: the spec's "
                                                    "verify.samples)")
    d.add_argument("--json", action="store_true", help="print the result as JSON")
    d.set_defaults(func=cmd_debug_numerics)
