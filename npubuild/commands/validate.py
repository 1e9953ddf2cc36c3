"""`npubuild validate`: load and check specs without building."""

from __future__ import annotations


def check_data_files(builds) -> None:
    """Open each calibration and evaluation-input file against its model's inputs, as the build would
    (frontend/data.py): an empty, NaN, complex or wrong-shape array is found here, not in the quantize stage."""
    from npubuild.frontend.data import load_arrays, model_inputs

    seen: set[tuple] = set()
    for b in builds:
        files = [f for f in (b.calibration_npy, b.evaluation[0] if b.evaluation else None) if f is not None]
        for f in files:
            key = (b.model_path, f, repr(sorted(b.model.input_shapes.items())))
            if key not in seen:
                seen.add(key)
                load_arrays(f, model_inputs(b.model_path, b.model.input_shapes))


def cmd_validate(args) -> int:
    from npubuild.config.load import load_specs, spec_paths

    builds = load_specs(spec_paths(args.specs))
    check_data_files(builds)
    specs = sorted({str(b.spec_path) for b in builds})
    print(f"ok: {len(specs)} spec(s), {len(builds)} build(s)")
    for b in builds:
        print(f"  {b.id}  ({b.target.accelerator}, pipeline {b.pipeline.name})")
    return 0


def register(sub) -> None:
    v = sub.add_parser("validate", help="check specs without building")
    v.add_argument("specs", nargs="*")
    v.set_defaults(func=cmd_validate)
