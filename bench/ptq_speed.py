"""The quantize stage alone on real specs: its seconds, CPU seconds and a digest of what it wrote (issue 33).

    python bench/ptq_speed.py SPEC_OR_DIR ... --work DIR [--out results.json] [--profile DIR] [--only NAME ...]
                              [--check-templates]

Each spec's models are imported once (the import stage's work, cached in DIR/import) and then quantised
as the quantize stage does (frontend/quantize.py: quantize_model) into DIR/quantize: per model the wall and
process CPU seconds of that call, the load average, the SHA-256 of model_qdq.onnx and the stage's metrics
(the PTQ choice record). Two runs' results compared (bench/ptq_same.py) show a change to the PTQ choice
left its outputs byte-identical. --profile writes a cProfile (in CPU seconds) of each quantize call.
--check-templates also runs onnxruntime's full quantiser for every candidate replayed from a template
(frontend/qdq_template.py) and stops unless the two are the same bytes (slower: for evidence, not timing).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import time
from pathlib import Path

from npubuild.config.load import collect_spec_files, load_spec
from npubuild.frontend.normalise import import_model
from npubuild.frontend.qdq_template import TemplateQuantizer
from npubuild.frontend.quantize import quantize_model
from npubuild.frontend.samples import SampleSource


def quantize_one(build, work: Path, profile: Path | None) -> dict:
    """Import (once, kept) then quantise one build's model, timed."""
    name = f"{build.spec.name}.{build.model_name}"
    imported = work / "import" / name / "model.onnx"
    if not imported.exists():
        imported.parent.mkdir(parents=True, exist_ok=True)
        import_model(build.model_path, dict(build.model.input_shapes), imported)
    out = work / "quantize" / name / "model_qdq.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile(time.process_time) if profile else None  # CPU seconds: the machine is shared
    replayed, checked = TemplateQuantizer.replayed, TemplateQuantizer.checked
    wall, cpu = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    source = SampleSource.of(build)  # as stages/quantize.py plans it
    metrics = quantize_model(imported, build.spec.quantization, build.model.calibration, build.calibration_npy, out,
                             source if source.kind == "held-back" else None, dict(build.model.feedback.items()))
    if prof:
        prof.disable()
        profile.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(profile / f"{name}.prof"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"model": name, "seconds": round(wall, 2), "cpu_s": round(cpu, 2), "load": round(os.getloadavg()[0], 2),
            "sha256": hashlib.sha256(out.read_bytes()).hexdigest(), "metrics": metrics,
            "replayed": TemplateQuantizer.replayed - replayed, "checked": TemplateQuantizer.checked - checked}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="+", type=Path)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--profile", type=Path)
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--check-templates", action="store_true")
    a = p.parse_args()
    TemplateQuantizer.check = a.check_templates
    results, seen = [], set()
    for spec in collect_spec_files(a.specs):
        for build in load_spec(spec):
            name = f"{build.spec.name}.{build.model_name}"
            if name in seen or (a.only and build.model_name not in a.only) or build.pipeline.profile != "int":
                continue
            seen.add(name)
            r = quantize_one(build, a.work, a.profile)
            print(f"{r['model']:32s} {r['seconds']:8.2f} s {r['cpu_s']:8.2f} cpu s load {r['load']:5.2f} "
                  f"{r['sha256'][:12]} replayed {r['replayed']} checked {r['checked']} {r['metrics'].get('quantization', {}).get('candidates', '')}", flush=True)
            results.append(r)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
