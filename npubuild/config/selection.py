"""What a run was asked to build: the spec files or directories (the project's configs/ when none is named)
and `--only`'s globs over build ids.

Made once per run, by `npubuild build` and by plain `doit` (NPUBUILD_SPECS), and kept in report.json, so
that a baseline comparison (report/regress.py) can tell a build this run did not ask for from one it lost.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.errors import InputError

if TYPE_CHECKING:
    from npubuild.config.load import Build


def matches(build_id: str, pattern: str) -> bool:
    """`--only` matching: a pattern with '/' matches the id's leading parts (`kws/*`, `kws/ds_cnn`,
    `*/*/ethos-u55-*`); one without matches any single part (spec, model or target)."""
    parts = build_id.split("/")
    n = pattern.count("/") + 1
    if n > 1:
        return fnmatch.fnmatchcase("/".join(parts[:n]), pattern)
    return any(fnmatch.fnmatchcase(p, pattern) for p in parts)


@dataclass(frozen=True)
class Selection:
    specs: tuple[str, ...]  # the spec paths loaded
    default: bool  # no spec was named: the whole project (its configs/) was asked for
    spec_names: tuple[str, ...]  # the `name:` of every spec loaded, sorted
    only: tuple[str, ...] = ()  # --only globs (none: every build of those specs)

    @classmethod
    def load(cls, paths: Iterable[Path], default: bool, only: Iterable[str] = ()) -> tuple[Selection, list[Build]]:
        """Load the specs at `paths`: the selection and the builds it asks for (an `only` glob matching no
        build is bad input: a typo, not an empty nightly)."""
        from npubuild.config.load import load_specs

        paths = list(paths)
        builds = load_specs(paths)
        selection = cls(tuple(str(p) for p in paths), default, tuple(sorted({b.spec.name for b in builds})),
                        tuple(only))
        return selection, selection.select(builds)

    def select(self, builds: list[Build]) -> list[Build]:
        """The builds `only` asks for (all without it)."""
        if not self.only:
            return builds
        for pat in self.only:
            if not any(matches(b.id, pat) for b in builds):
                raise InputError(f"--only '{pat}' matches no build (ids are spec/model/target, "
                                 f"e.g. {builds[0].id if builds else 'none loaded'})")
        return [b for b in builds if any(matches(b.id, p) for p in self.only)]

    def asked_for(self, build_id: str) -> bool:
        """Whether this selection asks for the build `build_id` (of a baseline, say): its spec was loaded (or
        the whole project was asked for, so a spec that went is lost) and an `only` glob, if any, matches it."""
        if build_id.split("/", 1)[0] not in self.spec_names:
            return self.default
        return not self.only or any(matches(build_id, p) for p in self.only)

    def to_json(self) -> dict[str, Any]:
        return {"specs": list(self.specs), "default": self.default, "spec_names": list(self.spec_names),
                "only": list(self.only)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Selection:
        return cls(tuple(d.get("specs") or ()), bool(d.get("default")), tuple(d.get("spec_names") or ()),
                   tuple(d.get("only") or ()))
