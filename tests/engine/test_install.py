"""npubuild as a product repo uses it: a wheel installed in a fresh venv outside the checkout.

The wheel must carry the target profiles and pipelines (they live at the repository's top level); the
product repo `npubuild init` writes must build with `npubuild build` and with plain `doit`, from a
subdirectory, sharing one stage cache that `npubuild clean` leaves alone.

To cost seconds rather than a minute of downloads, the fresh venv gets the wheel alone (`--no-deps`) and
borrows the test venv's third-party packages through a .pth file; that venv's own npubuild (an editable
install, or PYTHONPATH) is not visible there, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from npbtest import REPO

pytestmark = pytest.mark.install
SOURCES = ("npubuild", "targets", "pipelines", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh venv outside the checkout with the wheel built from this checkout installed in it."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy: setuptools writes build/ and *.egg-info next to the sources
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPUBUILD_CACHE", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)], tmp, env)
    wheel = next((tmp / "dist").glob("npubuild-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], tmp, env)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env)
                .stdout.strip())
    borrowed = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_borrowed_deps.pth").write_text("\n".join(borrowed) + "\n")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


def test_wheel_ships_profiles_and_a_scaffolded_repo_builds_with_npubuild_and_doit(venv, tmp_path: Path):
    root, env = venv
    py, npubuild = root / "bin" / "python", root / "bin" / "npubuild"
    where = _run([str(py), "-c", "import npubuild.config.load as m; print(m.__file__); print(m.SHIPPED_ROOT)"],
                 tmp_path, env).stdout.split()
    assert where[0].startswith(str(root)) and where[1].startswith(str(root))  # the wheel's own copy, not REPO's
    assert Path(where[1], "targets", "ethos-u55-128.yaml").is_file()

    work = tmp_path / "work"  # outside any project: the shipped profiles and pipelines are all there is
    work.mkdir()
    targets = _run([str(npubuild), "targets"], work, env).stdout
    assert "ethos-u55-128" in targets and "ethos-u85-2048" in targets
    assert "default" in _run([str(npubuild), "pipelines"], work, env).stdout
    assert _run([str(npubuild), "--version"], work, env).stdout.startswith("npubuild ")

    _run([str(npubuild), "init", "product", "--name", "doorbell"], work, env)
    product = work / "product"
    configs = product / "configs"
    out = _run([str(npubuild), "build", "-q"], configs, env).stdout  # from a subdirectory: walks up
    assert f"report: {product / 'build' / 'report.json'}" in out
    report = json.loads((product / "build" / "report.json").read_text())
    assert {b["target"] for b in report["builds"]} == {"doorbell-u55", "ethos-u85-256"}
    assert all(b["status"] == "passed" for b in report["builds"])
    assert (product / "build" / "schema.json").is_file()  # where the scaffolded spec's $schema comment points
    assert "$schema=../build/schema.json" in (configs / "doorbell.yaml").read_text()

    # plain doit from a subdirectory (-k: doit seeks dodo.py upwards), into another build dir: every stage
    # comes from the shared stage cache the first build filled (the per-build report tasks are never cached)
    env_doit = {**env, "NPUBUILD_BUILD_DIR": str(product / "build-doit")}
    _run([str(py), "-m", "doit", "-k"], configs, env_doit)
    run = json.loads((product / "build-doit" / "run.json").read_text())
    computed = sorted(set(run["executed"]) - set(run["from_cache"]))
    assert run["from_cache"] and all(t.startswith("report:") for t in computed), run

    # `npubuild clean` empties the build dir but not the shared cache: the next build restores, computes nothing
    _run([str(npubuild), "clean"], product, env)
    assert not (product / "build" / "stages").exists() and (product / ".npubuild" / "cache").is_dir()
    _run([str(npubuild), "build", "-q"], product, env)
    run = json.loads((product / "build" / "run.json").read_text())
    assert all(t.startswith("report:") for t in set(run["executed"]) - set(run["from_cache"])), run
