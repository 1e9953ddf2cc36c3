"""Where the CPU seconds of one cold `npubuild compile` go, over its whole process tree: the build process, each
stage's forked child, the children's forks (Vela's compiles, the check's workers), for one or more trees.

    PYTHONPATH=. /work/main/.venv/bin/python bench/compile_split.py [--model ds_cnn] [--target ethos-u55-128]
        [--tree before=/path/to/old/tree --tree after=.] [--repeats 3] [--out FILE.md]

A benchmark script, not part of npubuild. Each run is `npubuild compile` in a fresh interpreter that first wraps,
by module name as each is imported, the functions below with a process-CPU-time accountant (exclusive time:
a wrapped call inside another is not counted twice), and `import` itself (the time of each first import, by
top-level package, in the process that imports it; stage modules are imported in the build process before
each fork, engine/execute.prepare_stage); each process writes its account when it ends (a fork's `os._exit`
included). Every TOSA reference-model run is logged with a digest of its graph and inputs, so a run made twice
in one build (the same graph on the same inputs) is counted. CPU is user + system of each process
(getrusage), not wall: the machine is shared. Prints one table per tree (the repeat with the least total CPU;
the repeats' totals beside it), and the reference-model runs and their duplicates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in the child interpreter: argv = [OUTDIR, npubuild args...]; PYTHONPATH = the tree
HARNESS = r'''
import resource
_r = resource.getrusage(resource.RUSAGE_SELF)
STARTUP = _r.ru_utime + _r.ru_stime  # the interpreter and site, before this harness
import builtins, hashlib, importlib, importlib.abc, json, os, sys, time, traceback
out, args = sys.argv[1], sys.argv[2:]
cpu = time.process_time
S = {"label": "build process", "acc": {}, "stack": [], "t0": 0.0, "trm": []}

def reset(label):
    r = resource.getrusage(resource.RUSAGE_SELF)
    S.update(label=label, acc={}, stack=[], trm=[], t0=r.ru_utime + r.ru_stime)

def enter(key):
    S["stack"].append([key, cpu(), 0.0])

def leave():
    key, t, inner = S["stack"].pop()
    spent = cpu() - t
    S["acc"][key] = S["acc"].get(key, 0.0) + spent - inner
    if S["stack"]:
        S["stack"][-1][2] += spent

def wrap(fn, key):
    def w(*a, **k):
        enter(key)
        try:
            return fn(*a, **k)
        finally:
            leave()
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(w, attr, getattr(fn, attr, None))
    w.__wrapped__ = fn
    return w

TARGETS = json.loads(os.environ["SPLIT_TARGETS"])

def patch(mod):
    for path in TARGETS.get(mod.__name__, []):
        obj, parts = mod, path.split(".")
        for p in parts[:-1]:
            obj = getattr(obj, p)
        f = getattr(obj, parts[-1], None)
        if f is not None:
            setattr(obj, parts[-1], wrap(f, f"{mod.__name__}.{path}"))
    if mod.__name__ == "tosa_reference_model":
        real = mod.run
        def run(tosa, arrays, *a, **k):
            h = hashlib.sha256(hashlib.sha256(bytes(tosa)).digest())
            for x in arrays:
                h.update(f"{x.dtype}|{x.shape}|".encode()); h.update(x.tobytes())
            t = cpu(); enter("tosa_reference_model.run")
            try:
                return real(tosa, arrays, *a, **k)
            finally:
                leave()
                where = [f"{f.filename.rsplit('npubuild/', 1)[-1]}:{f.name}" for f in traceback.extract_stack()[:-1]
                         if "npubuild/" in f.filename]
                S["trm"].append({"key": h.hexdigest()[:16], "cpu": cpu() - t, "where": where[-3:]})
        mod.run = run

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS and name != "tosa_reference_model":
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                real_exec = spec.loader.exec_module
                def exec_module(m, real_exec=real_exec):
                    real_exec(m)
                    patch(m)
                spec.loader.exec_module = exec_module
                return spec
        return None
sys.meta_path.insert(0, Finder())

real_import = builtins.__import__
def counted_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name in sys.modules:
        return real_import(name, globals, locals, fromlist, level)
    top = ((globals or {}).get("__package__") or "") if level else name
    enter("import " + top.split(".")[0])
    try:
        return real_import(name, globals, locals, fromlist, level)
    finally:
        leave()
builtins.__import__ = counted_import
real_import_module = importlib.import_module
def counted_import_module(name, package=None):
    if name in sys.modules:
        return real_import_module(name, package)
    enter("import " + name.split(".")[0])
    try:
        return real_import_module(name, package)
    finally:
        leave()
importlib.import_module = counted_import_module

def dump():
    while S["stack"]:
        leave()
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(f"{out}/{os.getpid()}.json", "w") as f:
        json.dump({"pid": os.getpid(), "label": S["label"], "cpu": r.ru_utime + r.ru_stime - S["t0"],
                   "startup": STARTUP if S["label"] == "build process" else 0.0,
                   "acc": S["acc"], "trm": S["trm"]}, f)

real_exit = os._exit
def exit_after_dump(code):
    try:
        dump()
    finally:
        real_exit(code)
os._exit = exit_after_dump
os.register_at_fork(after_in_child=lambda: reset(S["label"] + " (fork)"))
import npubuild.engine.isolate as iso
real_outcome = iso._outcome
def labelled_outcome(fn, a, memory_bytes, what):  # the stage's child: named by the stage it runs
    S["label"] = what
    return real_outcome(fn, a, memory_bytes, what)
iso._outcome = labelled_outcome
reset("build process")
sys.argv = ["npubuild", *args]
import runpy
try:
    runpy.run_module("npubuild", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    dump()
'''

# functions accounted (exclusive CPU), by module; the rows they go to
TARGETS = {
    "npubuild.engine.plan": ["make_plan"],
    "npubuild.engine.versions": ["source_fingerprint", "tool_version"],
    "npubuild.engine.uptodate": ["fingerprint", "hash_outputs", "check_producers", "upstream_digests", "write_inputs",
                                 "is_done", "clear_debris"],
    "npubuild.engine.cache": ["cache_key", "StageCache.__init__"],
    "npubuild.store": ["Store.get", "Store.put", "Store.read", "Store.prune_size"],
    "npubuild.engine.execute": ["write_record", "prepare_stage", "run_in_child"],
    "npubuild.engine.isolate": ["_forked"],
    "npubuild.report.run": ["RunReports.close", "RunReports.build_done"],
    "npubuild.config.load": ["adhoc_builds"],
    "npubuild.tosa.run": ["OnnxSession.__init__", "OnnxSession.__call__"],
    "npubuild.ethosu.vela": ["_vela_child"],
    "doit.doit_cmd": ["DoitMain.run"],
}
ROWS = [  # (row, what it sums: exact keys or "import X" prefixes)
    ("imports: npubuild's own modules", ["import npubuild"]),
    ("imports: ethosu.vela", ["import ethosu"]),
    ("imports: numpy", ["import numpy"]),
    ("imports: onnx, onnx_ir, protobuf", ["import onnx", "import onnx_ir", "import google"]),
    ("imports: onnxruntime", ["import onnxruntime"]),
    ("imports: pydantic (+ pydantic_core, annotated_types, email)",
     ["import pydantic", "import pydantic_core", "import annotated_types", "import email", "import typing_inspection"]),
    ("imports: tosa tools (serializer, reference model, ml_dtypes, flatbuffers)",
     ["import tosa_serializer", "import tosa_reference_model", "import ml_dtypes", "import flatbuffers"]),
    ("imports: tflite_micro", ["import tflite_micro"]),
    ("imports: fsspec + asyncio (the stage cache)", ["import fsspec", "import asyncio"]),
    ("imports: yaml, doit, the rest", ["import "]),
    ("plan: source fingerprints", ["npubuild.engine.versions.source_fingerprint"]),
    ("plan: the rest (tool versions, specs, tasks)", ["npubuild.engine.versions.tool_version",
                                                      "npubuild.config.load.adhoc_builds",
                                                      "npubuild.engine.plan.make_plan"]),
    ("files: hashing, records, the stage cache", ["npubuild.engine.uptodate.", "npubuild.engine.cache.", "npubuild.store.",
                                                  "npubuild.engine.execute.write_record"]),
    ("doit and the forks (the build process's side)", ["doit.doit_cmd.DoitMain.run", "npubuild.engine.isolate._forked",
                                                       "npubuild.engine.execute.prepare_stage"]),
    ("reports", ["npubuild.report.run."]),
]


def split_once(model: Path, target: str, tree: Path, work: Path) -> list[dict]:
    accounts, build, cache = work / "accounts", work / "build", work / "cache"
    for d in (accounts, build, cache):
        shutil.rmtree(d, ignore_errors=True)
    accounts.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"}, "PYTHONPATH": str(tree),
           "NPUBUILD_CACHE": str(cache), "SPLIT_TARGETS": json.dumps(TARGETS)}
    proc = subprocess.run([sys.executable, "-c", HARNESS, str(accounts), "compile", str(model), "--target", target,
                           "--json", "--build-dir", str(build)], cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-800:])
    return [json.loads(p.read_text()) for p in sorted(accounts.glob("*.json"))]


def rows_of(processes: list[dict]) -> dict[str, float]:
    """CPU seconds per row: the build process's by ROWS (what no row takes: 'build process: the rest'), each
    stage's process and its forks by reference-model runs, onnxruntime, Vela's compiles and the rest."""
    out: dict[str, float] = defaultdict(float)
    for p in processes:
        stage = p["label"].removesuffix(" (fork)").removeprefix("the ").removesuffix(" stage")
        if p["label"] == "build process":
            left = dict(p["acc"])
            for row, keys in ROWS:
                for k in [k for k in left if any(k == key or k.startswith(key) for key in keys)]:
                    out[row] += left.pop(k)
            out["build process: the rest (argument parsing, doit's loop, session)"] += p["cpu"] - sum(
                p["acc"].values()) + sum(left.values())
            out["python start-up (interpreter, site; before the build process's account)"] += p["startup"]
            continue
        trm = p["acc"].get("tosa_reference_model.run", 0.0)
        ort = sum(v for k, v in p["acc"].items() if k.startswith("npubuild.tosa.run.OnnxSession"))
        vela = p["acc"].get("npubuild.ethosu.vela._vela_child", 0.0)
        out[f"stage {stage}: TOSA reference model"] += trm
        out[f"stage {stage}: onnxruntime (sessions, runs)"] += ort
        out[f"stage {stage}: Vela compiles (forks)"] += vela
        out[f"stage {stage}: the rest"] += p["cpu"] - trm - ort - vela
    return dict(out)


def total(processes: list[dict]) -> float:
    """A run's CPU seconds: every process's, the build process's start-up included."""
    return sum(p["cpu"] + p.get("startup", 0.0) for p in processes)


def duplicates(processes: list[dict]) -> tuple[int, int, float]:
    """Reference-model runs, those that repeat an earlier run of the build (same graph, same inputs), and the
    repeats' CPU seconds."""
    seen: dict[str, int] = defaultdict(int)
    runs = dup = 0
    dup_s = 0.0
    for p in processes:
        for r in p["trm"]:
            runs += 1
            seen[r["key"]] += 1
            if seen[r["key"]] > 1:
                dup += 1
                dup_s += r["cpu"]
    return runs, dup, dup_s


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ds_cnn", help="a name in configs/models or an .onnx path")
    ap.add_argument("--target", default="ethos-u55-128")
    ap.add_argument("--tree", action="append", metavar="NAME=PATH")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)} if args.tree else {"this": ROOT}
    model = Path(args.model) if args.model.endswith(".onnx") else ROOT / "configs" / "models" / f"{args.model}.onnx"
    for tree in trees.values():  # bytecode, as an installed npubuild has it
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "npubuild")], check=True,
                       capture_output=True)
    runs: dict[str, list[list[dict]]] = {t: [] for t in trees}
    loads = []
    with tempfile.TemporaryDirectory(prefix="npb-compile-split-") as tmp:
        for _ in range(args.repeats):
            for t, tree in trees.items():
                runs[t].append(split_once(model, args.target, tree, Path(tmp)))
                loads.append(os.getloadavg()[0])
                print(t, round(total(runs[t][-1]), 3), flush=True)
    best = {t: min(rs, key=total) for t, rs in runs.items()}
    tables = {t: rows_of(ps) for t, ps in best.items()}
    names = list(dict.fromkeys(r for tab in tables.values() for r in tab))
    lines = [f"One cold `npubuild compile` ({model.stem} {args.target}): CPU seconds by where they go, the whole "
             f"process tree; the repeat with the least total of {args.repeats} per tree (load average "
             f"{min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores).", "",
             "| where | " + " | ".join(trees) + " |", "|---|" + "---:|" * len(trees)]
    for name in names:
        vals = [tables[t].get(name, 0.0) for t in trees]
        if max(vals) >= 0.0005:
            lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(tables[t].values()):.3f}**" for t in trees) + " |")
    lines.append("| totals of the repeats | " + " | ".join(
        ", ".join(f"{total(ps):.2f}" for ps in runs[t]) for t in trees) + " |")
    lines.append("| reference-model runs (of them repeats of an earlier run: their CPU s) | " + " | ".join(
        "{} ({}: {:.3f})".format(*duplicates(best[t])) for t in trees) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
