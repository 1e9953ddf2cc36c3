"""`npubuild validate`: load and check specs without building.

Beyond what loading checks (keys, types, names, files), each model's graph inputs are read so that
`input_shapes` naming an input the model does not have, giving the wrong rank, or a dynamic dim left
open fail here, with the spec's position, instead of in the build; and each dynamic input is listed with
the shape it gets and where each size came from (frontend/input_shapes.py).
"""

from __future__ import annotations

from npubuild.commands import SPECS_HELP


def check_model_inputs(builds: list) -> list[str]:
    """The import stage's input checks (frontend.normalise.set_static_shapes) for each spec's models; a line
    per dynamic input saying what it becomes."""
    from npubuild.config.yamlfile import KEY, load_yaml, locate
    from npubuild.errors import Location
    from npubuild.frontend.normalise import load_onnx, set_static_shapes

    seen: set[tuple[str, str]] = set()
    marks_of: dict = {}
    lines: list[str] = []
    for b in builds:
        if (str(b.spec_path), b.model_name) in seen:
            continue
        seen.add((str(b.spec_path), b.model_name))
        if b.spec_path not in marks_of:
            marks_of[b.spec_path] = load_yaml(b.spec_path)[1]
        marks = marks_of[b.spec_path]
        fallback = locate(marks, ("models", b.model_name), Location(str(b.spec_path)))
        shapes = b.model.input_shapes
        where = fallback
        model = load_onnx(b.model_path)
        inits = {i.name for i in model.graph.initializer}
        names = {i.name for i in model.graph.input if i.name not in inits}
        for name in shapes:  # point at the key naming a missing input
            if name not in names:
                where = marks.get(("models", b.model_name, "input_shapes", name, KEY), fallback)
                break
        else:
            if shapes:
                where = locate(marks, ("models", b.model_name, "input_shapes"), fallback)
        resolved = set_static_shapes(model, dict(shapes), str(where))
        lines += [f"  {b.spec_path.name}: model '{b.model_name}': dynamic input {s.describe()}"
                  for s in resolved if s.dynamic]
    return lines


def check_data_files(builds) -> None:
    """Open each calibration and evaluation-input file against its model's inputs, as the build would
    (frontend/data.py): an empty, NaN, complex or wrong-shape array is found here, not in the quantize stage."""
    from npubuild.frontend.data import load_arrays, model_inputs

    seen: set[tuple] = set()
    for b in builds:
        files = [f for f in (b.calibration_npy, b.evaluation.inputs if b.evaluation else None) if f is not None]
        for f in files:
            key = (b.model_path, f, repr(sorted(b.model.input_shapes.items())))
            if key not in seen:
                seen.add(key)
                load_arrays(f, model_inputs(b.model_path, b.model.input_shapes))


def cmd_validate(args) -> int:
    from npubuild.config.load import load_specs, spec_paths

    builds = load_specs(spec_paths(args.specs))
    dynamic = check_model_inputs(builds)
    check_data_files(builds)
    specs = sorted({str(b.spec_path) for b in builds})
    print(f"ok: {len(specs)} spec(s), {len(builds)} build(s)")
    for b in builds:
        print(f"  {b.id}  ({b.target.accelerator}, pipeline {b.pipeline.name})")
    if dynamic:
        print("dynamic inputs (the model leaves these dims open; the build uses the sizes after ->):")
        print("\n".join(dynamic))
    return 0


def register(sub) -> None:
    v = sub.add_parser("validate", help="check specs without building",
                       description="Load and check compile specs (keys, types, names, files, model inputs); "
                                   "build nothing. Exit 2 with one file:line:col line on the first problem.")
    v.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR", help=SPECS_HELP)
    v.set_defaults(func=cmd_validate)
