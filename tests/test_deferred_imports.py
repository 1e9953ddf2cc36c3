"""Code that uses sympy after npubuild deferred it (npubuild/deferred_imports.py) still gets the real one; that a
compile never imports it is tests/engine/test_compile_imports.py."""

from __future__ import annotations

import subprocess
import sys


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


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
