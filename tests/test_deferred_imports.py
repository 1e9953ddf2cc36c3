"""sympy stays out of a compile (npubuild/deferred_imports.py), and code that uses it still gets the real one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from npbtest import REPO


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_a_cold_compile_imports_onnx_ir_but_not_sympy(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "npubuild", "compile",
                           str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target", "ethos-u55-128",
                           "--build-dir", str(tmp_path / "build")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"onnx_ir", "onnx_ir.passes.common", "onnxruntime"} <= imported  # the forked stages' imports are there
    assert not {name for name in imported if name == "sympy" or name.startswith("sympy.")}


def test_onnx_ir_symbolic_dims_still_use_the_real_sympy():
    proc = _python(
        "import sys, types\n"
        "import npubuild, onnx_ir as ir\n"
        "assert 'sympy.core' not in sys.modules, 'sympy loaded with onnx_ir'\n"
        "dim = ir.SymbolicDim('N') * 2 + 1\n"
        "import sympy\n"
        "assert type(sys.modules['sympy']) is types.ModuleType and sys.modules['sympy'] is sympy\n"
        "assert isinstance(dim._expr, sympy.Expr)\n"
        "assert str(ir.SymbolicDim('max(N, 3)')._expr) == 'Max(3, N)'  # the parser's sympy.Max\n"
        "print(dim)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "2*N + 1"


def test_a_sympy_submodule_imported_first_loads_the_package():
    proc = _python("import npubuild, sys\n"
                   "from sympy.core.numbers import Integer\n"
                   "import sympy\n"
                   "assert type(sympy).__name__ == 'module' and sympy.Integer is Integer\n"
                   "print(Integer(7) + sympy.Integer(5))\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "12"
