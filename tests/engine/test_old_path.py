"""The engine's old import path (npubuild.build, one release) and the stable entry for a project's dodo.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=300)


def test_the_old_path_warns_once_and_hands_back_the_engines_own_modules():
    proc = _python(
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from npubuild.build.doit_executor import dodo_namespace\n"
        "    import npubuild.build.plan as old_plan\n"
        "    from npubuild.build import session\n"
        "import npubuild, npubuild.engine.doit_executor as d, npubuild.engine.plan as p, npubuild.engine.session as s\n"
        "from npubuild.build.doit_executor import namespace\n"
        "assert dodo_namespace is npubuild.dodo_namespace and namespace is d.namespace\n"
        "assert old_plan is p and session is s\n"
        "assert old_plan.StageTask is p.StageTask and p.__spec__.name == 'npubuild.engine.plan'\n"
        "print(len(caught), caught[0].category.__name__, caught[0].message)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, category, message = proc.stdout.strip().split(" ", 2)
    assert (count, category) == ("1", "FutureWarning")
    assert "npubuild.engine" in message and "from npubuild import dodo_namespace" in message


def test_an_unknown_name_under_the_old_path_is_not_found():
    proc = _python("import npubuild.build as b\n"
                   "assert not hasattr(b, 'no_such_module')\n"
                   "try:\n"
                   "    import npubuild.build.no_such_module\n"
                   "except ModuleNotFoundError as exc:\n"
                   "    print(exc.name)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "npubuild.engine.no_such_module"


def test_the_public_dodo_entry_is_light_and_is_the_engines():
    proc = _python("import sys, npubuild\n"
                   "assert 'npubuild.engine.doit_executor' not in sys.modules and 'doit' not in sys.modules\n"
                   "from npubuild.commands.init import DODO_PY\n"
                   "assert 'from npubuild import dodo_namespace' in DODO_PY\n"
                   "print('ok')\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


OLD_DODO_PY = """from npubuild.build.doit_executor import dodo_namespace

globals().update(dodo_namespace(__file__))
"""


def test_an_older_projects_dodo_py_still_loads_its_tasks(tmp_path: Path):
    """A product repo's dodo.py from before the rename (the old path's `dodo_namespace(__file__)`): doit
    lists the build's tasks, with one warning naming the new entry."""
    from npubuild.commands.init import scaffold

    scaffold(tmp_path, "watch")
    (tmp_path / "dodo.py").write_text(OLD_DODO_PY)
    proc = subprocess.run([sys.executable, "-W", "default", "-m", "doit", "list", "--all"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tasks = proc.stdout.split()
    assert "import" in tasks and "vela" in tasks and "report" in tasks, proc.stdout
    assert proc.stderr.count("FutureWarning") == 1 and "from npubuild import dodo_namespace" in proc.stderr
