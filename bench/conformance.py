"""ONNX's backend node tests through npubuild (tests/npbtest/conformance/): the outcome table and times.

    PYTHONPATH=<npubuild tree> python bench/conformance.py [--only SUBSTRING] [--no-vela] [--json FILE]
                                                          [--failures]

Prints `profile | pass | wrong | clean unsupported | host | crash` for FP and INT over the selected tests,
the seconds each profile took, and with --failures every test that neither passed nor ran on the host
(the format of tests/conformance/expected.py). The runner is this tree's; npubuild is whichever tree
PYTHONPATH names, so the same script measures a tree before the host fallback and after
(bench/conformance.md keeps the numbers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the npbtest helpers

from npbtest.conformance import OUTCOMES, VelaRunner, quiet_onnxruntime, run_fp, run_int, select  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the tests whose name contains this")
    ap.add_argument("--no-vela", action="store_true", help="INT without Vela placement")
    ap.add_argument("--json", type=Path, help="write every test's outcome and detail here")
    ap.add_argument("--failures", action="store_true", help="list the tests that neither pass nor run on the host")
    args = ap.parse_args()
    quiet_onnxruntime()
    cases = [c for c in select() if args.only in c.name]
    vela = None if args.no_vela else VelaRunner()
    results: dict[str, dict] = {"fp": {}, "int": {}}
    seconds: dict[str, float] = {}
    try:
        for profile in ("fp", "int"):
            start = time.perf_counter()
            for case in cases:
                results[profile][case.name] = run_fp(case) if profile == "fp" else run_int(case, vela)
            seconds[profile] = time.perf_counter() - start
    finally:
        if vela is not None:
            vela.close()
    single = sum(1 for c in cases if "_expanded" not in c.name)
    print(f"{len(cases)} node tests ({single} single-op, {len(cases) - single} _expanded)"
          + ("" if vela is None else f"; {vela.compiles} Vela compiles") + "\n")
    print("| profile | pass | wrong | clean unsupported | host | crash | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for profile, label in (("fp", "FP (vs the test's expected outputs)"),
                           ("int", "INT (vs onnxruntime QDQ, <= 1 LSB" + ("" if vela is None else ", Vela U55/U85") + ")")):
        counts = {o: sum(1 for r in results[profile].values() if r.outcome == o) for o in OUTCOMES}
        print(f"| {label} | {counts['pass']} | {counts['wrong']} | {counts['unsupported']} | {counts['host']} | "
              f"{counts['crash']} | {seconds[profile]:.0f} |")
    if args.failures:
        for profile in ("fp", "int"):
            print(f"\n# {profile}")
            for name, r in sorted(results[profile].items()):
                if r.outcome not in ("pass", "host"):
                    print(f'    "{name}": "{r.outcome}: {r.detail[:150]}",')
    if args.json:
        args.json.write_text(json.dumps({p: {n: {"outcome": r.outcome, "detail": r.detail, "seconds": r.seconds}
                                             for n, r in rs.items()} for p, rs in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
