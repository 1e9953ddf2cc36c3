"""Where the CPU seconds of one cold `npubuild build SPEC` go beyond the model runs: cProfile in every process of
the build's tree (the build process, each stage's fork, the forks' worker pools and Vela's forks).

    PYTHONPATH=. /work/main/.venv/bin/python bench/build_split.py SPEC [--tree PATH] [--top 60] [--out DIR]

A benchmark script, not part of npubuild. The build runs in a fresh interpreter that profiles itself and, after
each fork, the child afresh (os.register_at_fork); each process dumps its profile when it ends (a fork's
os._exit included) as <out>/<pid>.<label>.prof. Prints the functions with the most own (tottime) and cumulative
CPU over all processes, and each process's total: cProfile's figures, so Python-heavy code is inflated by its
overhead (~1.5-2x) and native runs are not: read it for where, bench/compile_real.py --clock-runs for how much.
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HARNESS = r'''
import cProfile, os, sys, runpy
out, args = sys.argv[1], sys.argv[2:]
P = {"prof": cProfile.Profile(), "label": "build"}
def dump():
    P["prof"].disable()
    P["prof"].dump_stats(f"{out}/{os.getpid()}.{P['label']}.prof")
def child():
    P["prof"].disable()
    P["label"] = "fork"
    P["prof"] = cProfile.Profile()
    P["prof"].enable()
os.register_at_fork(after_in_child=child)
real_exit = os._exit
def exit_after_dump(code):
    try:
        dump()
    finally:
        real_exit(code)
os._exit = exit_after_dump
sys.argv = ["npubuild", *args]
P["prof"].enable()
try:
    runpy.run_module("npubuild", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    dump()
'''


WAITS = ("'poll' of", "'acquire' of", "time.sleep", "posix.read", "waitpid", "select")
RUNS = ("tosa_reference_model.run", "onnxruntime_pybind11_state.run", "regor.compile")


def process_row(prof: Path) -> str:
    """One process's profiled seconds split into waiting (for children, workers, pipes), model runs and Vela's
    compiles (native: clocked alike by cProfile), and the rest (npu-sim's simulation, Python, is in the rest);
    `where`: the stage's `run` or the worker pool's task it ran, the largest ("the build" for none: the
    build process, or a fork that ran Vela)."""
    st = pstats.Stats(str(prof))
    waits = runs = 0.0
    where = []
    for (path, line, name), (_, _, tottime, cumtime, _) in st.stats.items():  # type: ignore[attr-defined]
        label = f"{path}:{line}({name})"
        waits += tottime if any(w in label for w in WAITS) else 0.0
        runs += tottime if any(r in label for r in RUNS) else 0.0
        if "/npubuild/" in path and (("/stages/" in path and name == "run") or name == "_run_index"):
            where.append((cumtime, f"{path.split('/npubuild/')[-1]}:{name}"))
    rest = st.total_tt - waits - runs  # type: ignore[attr-defined]
    top = max(where)[1] if where else "the build"
    return f"| {prof.name} | {st.total_tt:.2f} | {waits:.2f} | {runs:.2f} | {rest:.2f} | {top} |"  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("/tmp/npb-build-split"))
    args = ap.parse_args(argv)
    spec = args.spec.resolve()
    shutil.rmtree(args.out, ignore_errors=True)
    profs, build = args.out / "profiles", args.out / "build"
    profs.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}
    proc = subprocess.run([sys.executable, "-c", HARNESS, str(profs), "build", str(spec), "--build-dir", str(build),
                           "--cache", "off", "--keep-going", "-q"], cwd=spec.parent.parent, env=env,
                          capture_output=True, text=True)
    print("exit", proc.returncode, proc.stderr[-400:])
    files = sorted(profs.glob("*.prof"))
    print("| process | profiled s | waiting s | model runs and Vela s | the rest s | where |\n|---|---:|---:|---:|---:|---|")
    for f in files:
        print(process_row(f))
    st = pstats.Stats(*map(str, files))
    st.sort_stats("tottime").print_stats(args.top)
    st.sort_stats("cumulative").print_stats(args.top * 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
