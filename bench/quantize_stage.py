"""The quantize stage alone, again, on a finished build dir: its CPU seconds (or a cProfile), and whether the QDQ
model and the stage's metrics come out as the build's stage record says.

    PYTHONPATH=<tree> .venv/bin/python bench/quantize_stage.py BUILD_DIR --spec-dir DIR [--profile OUT.prof]

A benchmark script, not part of npubuild. BUILD_DIR is a cold build's (`npubuild build SPEC --build-dir BUILD_DIR`);
--spec-dir is the spec's directory (the calibration path in the stage's config is relative to it). Runs
frontend/quantize.quantize_model with the stage's own config on the import stage's model, in this process (no
fork): wall and CPU seconds (process CPU: onnxruntime's threads included), the CPU seconds inside onnxruntime's
InferenceSession.run (`runs`: the model runs, bench/runclock's count) and the rest (`beyond_runs`: session
creation, quantiser, statistics, scoring arithmetic), and `identical` true when the
model's sha256 and the metrics equal the build's. Run it with two trees on the same build dir, interleaved, for
a before/after of the stage's own code (issue 33: /work/notes/issue-33-quantize-own.md).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import tempfile
import time
from pathlib import Path


class RunClock:
    """Process CPU seconds spent inside onnxruntime's InferenceSession.run (one thread calls it at a time here)."""

    def __init__(self) -> None:
        import onnxruntime as ort

        self.seconds = 0.0
        original = ort.InferenceSession.run

        def run(session, *args, **kwargs):
            start = time.process_time()
            try:
                return original(session, *args, **kwargs)
            finally:
                self.seconds += time.process_time() - start

        ort.InferenceSession.run = run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", type=Path)
    ap.add_argument("--spec-dir", type=Path, required=True)
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()

    from npubuild.config.schema import Calibration, Quantization
    from npubuild.frontend.quantize import quantize_model
    from npubuild.frontend.samples import SampleSource

    record = json.loads(next((args.build_dir / "stages" / "quantize").glob("*/stage.json")).read_text())
    config = record["config"]
    float_model = next((args.build_dir / "stages" / "import").glob("*/model.onnx"))
    npy = config["calibration"].get("npy")
    held_back = SampleSource.from_json(config["held_back"]) if config.get("held_back") else None
    clock = RunClock()
    with tempfile.TemporaryDirectory(prefix="quantize-stage-") as tmp:
        out = Path(tmp) / "model_qdq.onnx"
        profile = cProfile.Profile() if args.profile else None
        wall, cpu = time.perf_counter(), time.process_time()
        if profile:
            profile.enable()
        metrics = quantize_model(float_model, Quantization.model_validate(config["quantization"]),
                                 Calibration.model_validate(config["calibration"]),
                                 args.spec_dir / npy if npy else None, out, held_back,
                                 {o: i for o, i in config.get("feedback", [])})
        if profile:
            profile.disable()
            profile.dump_stats(args.profile)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        same = hashlib.sha256(out.read_bytes()).hexdigest() == record["outputs"]["model_qdq.onnx"]["sha256"] \
            and metrics == record["metrics"]
    print(json.dumps({"build": args.build_dir.name, "wall": round(wall, 2), "cpu": round(cpu, 2), "runs": round(clock.seconds, 2),
                      "beyond_runs": round(cpu - clock.seconds, 2), "identical": same}))


if __name__ == "__main__":
    main()
