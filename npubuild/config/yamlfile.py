"""Safe YAML loading that remembers where every value came from.

pydantic reports errors as a path of keys (`models.kws.path`); to turn that
into `file:line:col` we keep, for each path, the position of its node. Values
merged from `extends:` parents keep their own file's positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from npubuild.errors import InputError, Location

KeyPath = tuple[str | int, ...]
KEY = "<key>"  # marks[(*path, KEY)] is where the key itself is written (for unknown-key errors)
Marks = dict[KeyPath, Location]


def _mark(file: str, node: yaml.Node) -> Location:
    return Location(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: KeyPath, file: str, marks: Marks) -> Any:
    marks[path] = _mark(file, node)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise InputError("mapping keys must be plain scalars", _mark(file, key_node))
            key = str(key)
            if key in out:
                raise InputError(f"duplicate key '{key}'", _mark(file, key_node))
            out[key] = _construct(loader, value_node, (*path, key), file, marks)
            marks[(*path, key, KEY)] = _mark(file, key_node)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, (*path, i), file, marks) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_yaml(path: Path) -> tuple[Any, Marks]:
    """Load one YAML document safely; returns the data and a map key-path -> location."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", file) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, {(): Location(file, 1, 1)}
        marks: Marks = {}
        data = _construct(loader, node, (), file, marks)
        return data, marks
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file)
        problem = exc.problem or exc.context or "malformed YAML"
        raise InputError(f"invalid YAML: {problem}", where) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", file) from None
    finally:
        loader.dispose()


def deep_merge(base: Any, override: Any, base_marks: Marks, override_marks: Marks, path: KeyPath = ()) -> tuple[Any, Marks]:
    """Merge `override` onto `base` (mappings recursively, everything else replaced: later wins)."""
    marks: Marks = {}
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for p, loc in base_marks.items():
            marks[p] = loc
        for key, value in override.items():
            sub = (*path, key)
            if key in base:
                merged, sub_marks = deep_merge(
                    base[key],
                    value,
                    _subtree(base_marks, sub),
                    _subtree(override_marks, sub),
                    sub,
                )
                out[key] = merged
                _drop_subtree(marks, sub)
                marks.update(sub_marks)
            else:
                out[key] = value
                marks.update(_subtree(override_marks, sub))
        if path in override_marks:
            marks[path] = override_marks[path]
        return out, marks
    return override, _subtree(override_marks, path)


def _subtree(marks: Marks, prefix: KeyPath) -> Marks:
    n = len(prefix)
    return {p: loc for p, loc in marks.items() if p[:n] == prefix}


def _drop_subtree(marks: Marks, prefix: KeyPath) -> None:
    n = len(prefix)
    for p in [p for p in marks if p[:n] == prefix]:
        del marks[p]


def locate(marks: Marks, path: KeyPath, default: Location) -> Location:
    """The location of the longest known prefix of `path` (pydantic paths may go deeper than YAML)."""
    for n in range(len(path), -1, -1):
        loc = marks.get(tuple(path[:n]))
        if loc is not None:
            return loc
    return default
