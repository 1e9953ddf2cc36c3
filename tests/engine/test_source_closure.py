"""The stage source fingerprint's file walk (engine/versions.py `_closure`, over files whose direct
dependencies are found once) gives every npubuild module the same files as the name-by-name walk it replaced
(`_closure_by_name`), so no cache key moves."""

from __future__ import annotations

from npubuild.engine import versions
from npubuild.stages import STAGES


def every_module() -> list[str]:
    root = versions.PACKAGE_ROOT
    names = ["npubuild"]
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(("npubuild", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


def test_the_file_walk_gives_every_module_the_files_of_the_name_walk():
    names = every_module()
    assert len(names) > 200
    for name in names:
        assert versions._closure(name) == versions._closure_by_name(name), name


def test_a_stage_runs_its_registry_packages_whole_and_not_the_engine():
    files = {f.relative_to(versions.PACKAGE_ROOT).as_posix() for f in versions._closure("npubuild.stages.lower")}
    assert "lowering/ops/__init__.py" in files and "stages/lower.py" in files
    assert sum(f.startswith("lowering/ops/") for f in files) > 5  # every module of the registry package
    assert not any(f.startswith("engine/") for f in files)
    assert len({versions.source_fingerprint(s.module) for s in STAGES}) == len(STAGES)
