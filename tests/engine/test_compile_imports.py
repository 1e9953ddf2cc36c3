"""What a cold compile imports, in the build process and in each stage's forked child: sympy nowhere
(npubuild/deferred_imports.py), and what the stages import inside their runs once, in the build process before
the forks (Stage.preload), not again in each child. (`-X importtime` cannot tell: doit swaps sys.stderr, where
it writes, for its capture while a task runs.)"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
from npbtest import REPO

from npubuild.stages import STAGES

# runs `npubuild compile` after wrapping what each forked child runs, to write the modules it imported
DRIVER = """
import gc, json, sys
import npubuild.engine.execute as execute
log, args = sys.argv[1], sys.argv[2:]
run = execute.run_in_child

def logged(task):
    before = set(sys.modules)
    try:
        return run(task)
    finally:
        with open(log, "a") as f:
            f.write(json.dumps({"child": task.stage, "new": sorted(set(sys.modules) - before),
                                "gc": gc.isenabled(), "frozen": gc.get_freeze_count()}) + "\\n")

execute.run_in_child = logged
from npubuild.cli import main
code = main(args)
with open(log, "a") as f:
    f.write(json.dumps({"parent": sorted(sys.modules)}) + "\\n")
raise SystemExit(code)
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, list[str]]:
    """The modules of one cold `npubuild compile` of the DS-CNN example: the build process's at the end
    ("parent") and those each stage's child imported (by stage name)."""
    work = tmp_path_factory.mktemp("compile")
    log = work / "modules.jsonl"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(log), "compile",
                           str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target", "ethos-u55-128",
                           "--build-dir", str(work / "build")], cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(r["gc"] and r["frozen"] > 10_000 for r in records if "child" in r)  # npubuild/longlived.py
    return {r.get("child", "parent"): r.get("new", r.get("parent")) for r in records}


def test_a_cold_compile_imports_onnx_ir_but_not_sympy(imported: dict[str, list[str]]):
    assert {"import", "quantize", "lower", "tosa-check", "vela"} <= set(imported)
    assert {"onnx_ir", "onnx_ir.passes.common", "onnxruntime", "ethosu.vela.vela"} <= set(imported["parent"])
    everywhere = [m for modules in imported.values() for m in modules]
    assert not [m for m in everywhere if m == "sympy.core" or m.startswith("sympy.core.")]


def test_a_cold_compile_with_a_local_cache_imports_neither_fsspec_nor_asyncio(imported: dict[str, list[str]]):
    """The local stage cache's and Vela cache's writes go through store.LocalFiles (fsspec's local semantics, done
    without it): fsspec and the asyncio it imports are for URL caches."""
    everywhere = {m for modules in imported.values() for m in modules}
    assert not {m for m in everywhere if m.split(".")[0] in ("fsspec", "asyncio")}


@pytest.mark.parametrize("module", ["onnxruntime", "onnx.reference", "onnx_ir.passes.common", "tosa_reference_model",
                                    "numpy.random", "npubuild.frontend.passes.fold", "npubuild.lowering.ops.conv"])
def test_what_the_stages_import_as_they_run_is_imported_before_the_forks(imported: dict[str, list[str]],
                                                                         module: str):
    assert module in imported["parent"]
    assert [stage for stage, modules in imported.items() if stage != "parent" and module in modules] == []


def test_every_preload_entry_names_a_module_and_function():
    for stage in STAGES:
        for entry in stage.preload:
            module, _, function = entry.partition(":")
            loaded = importlib.import_module(module)
            assert not function or callable(getattr(loaded, function)), (stage.name, entry)
