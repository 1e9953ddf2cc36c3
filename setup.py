"""Ship the target profiles and pipelines inside the wheel.

The design keeps targets/ and pipelines/ at the repository's top level (a checkout and an editable install
read them there); a wheel carries a copy as package data under npubuild/_shipped/, where
npubuild.config.load.shipped_root finds them with importlib.resources. Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("targets", "pipelines")


class BuildPyWithProfiles(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's own targets/ and pipelines/
        here = Path(__file__).resolve().parent
        for name in SHIPPED:
            dest = Path(self.build_lib) / "npubuild" / "_shipped" / name
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(here / name, dest, ignore=shutil.ignore_patterns("*~", ".*"))


setup(cmdclass={"build_py": BuildPyWithProfiles})
