"""Two bench/ptq_speed.py runs compared: the same model bytes and metrics (the PTQ choice record) per model.

    python bench/ptq_same.py BEFORE.json AFTER.json

One line per model (same / DIFFERENT, with what differs) and the quantize-stage seconds and CPU seconds of
each run; exit 1 if any model differs or is missing from one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    a = p.parse_args()
    before = {r["model"]: r for r in json.loads(a.before.read_text())}
    after = {r["model"]: r for r in json.loads(a.after.read_text())}
    bad = 0
    print("| model | model_qdq.onnx | metrics | s before -> after | CPU s before -> after |")
    print("|---|---|---|---:|---:|")
    for name in sorted(before.keys() | after.keys()):
        b, f = before.get(name), after.get(name)
        if b is None or f is None:
            print(f"| {name} | missing from {'before' if b is None else 'after'} | | | |")
            bad += 1
            continue
        same_bytes, same_metrics = b["sha256"] == f["sha256"], b["metrics"] == f["metrics"]
        bad += not (same_bytes and same_metrics)
        print(f"| {name} | {'same' if same_bytes else 'DIFFERENT'} {f['sha256'][:12]} | "
              f"{'same' if same_metrics else 'DIFFERENT'} | {b['seconds']:.1f} -> {f['seconds']:.1f} | "
              f"{b['cpu_s']:.1f} -> {f['cpu_s']:.1f} |")
    print(f"\n{len(before.keys() | after.keys()) - bad} of {len(before.keys() | after.keys())} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
