"""Whether two build dirs' lower and vela stages wrote the same files: every output file byte for byte, the stage
records' metrics as JSON (a change claimed behaviour-identical shows it so).

    python bench/same_stage_outputs.py BUILD_DIR_BEFORE BUILD_DIR_AFTER [--stages lower vela]

A benchmark aid, not part of npubuild. Stage dirs are matched by stage and task name (the key suffix dropped:
the trees' versions differ, so do the keys). Compared: every file under each stage dir, byte for byte, but
stage.json and inputs.json (they hold the run's id, keys, seconds and file times), whose `metrics` and `config`
(versions dropped) are compared as JSON instead; summary.json byte for byte (it holds no time). Prints one line
per stage dir and a total; exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RECORDS = ("stage.json", "inputs.json")


def stage_dirs(build: Path, stage: str) -> dict[str, Path]:
    """Task name (the dir name without its key suffix) -> its stage dir."""
    return {d.name.rsplit("-", 1)[0]: d for d in sorted((build / "stages" / stage).glob("*")) if d.is_dir()}


def record(d: Path) -> dict:
    rec = json.loads((d / "stage.json").read_text())
    config = {k: v for k, v in rec.get("config", {}).items() if k not in ("versions", "input", "lower")}
    return {"metrics": rec.get("metrics"), "config": config}


def compare(a: Path, b: Path) -> list[str]:
    """What differs between two stage dirs (empty: the same)."""
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and p.name not in RECORDS}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file() and p.name not in RECORDS}
    out = [f"only in one: {f}" for f in sorted(files_a ^ files_b)]
    out += [f"differs: {f}" for f in sorted(files_a & files_b) if (a / f).read_bytes() != (b / f).read_bytes()]
    if record(a) != record(b):
        out.append("stage.json metrics or config differ")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--stages", nargs="+", default=["lower", "vela"])
    args = ap.parse_args()
    bad = total = files = 0
    for stage in args.stages:
        before, after = stage_dirs(args.before, stage), stage_dirs(args.after, stage)
        for task in sorted(before.keys() | after.keys()):
            total += 1
            if task not in before or task not in after:
                print(f"{stage}/{task}: in one build only")
                bad += 1
                continue
            diffs = compare(before[task], after[task])
            n = sum(1 for p in before[task].rglob("*") if p.is_file() and p.name not in RECORDS)
            files += n
            print(f"{stage}/{task}: {'same' if not diffs else 'DIFFERENT'} ({n} files + metrics)"
                  + "".join(f"\n    {d}" for d in diffs))
            bad += bool(diffs)
    print(f"{total - bad} of {total} stage dirs the same ({files} files)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
