"""'Did you mean' for typos: command-line options, YAML keys, target and pipeline names, metric names.

A mistyped name is the commonest bad input; the error line names the closest valid one (difflib's ratio, as
git and cargo do) instead of listing every name, and lists them only when none is close.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable

from pydantic import BaseModel

CUTOFF = 0.6  # difflib ratio: `verfy`/`verify` 0.91, `ethos-u85-265`/`ethos-u85-256` 0.92, `acuracy` 0.93


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word`, or None when none is close enough to be what was meant."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=CUTOFF)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`; did you mean 'x'?` for the closest choice, or None."""
    match = closest(word, choices)
    return f"; did you mean '{match}'?" if match else None


def _flatten(tp) -> list:
    """The alternatives of a type: Optional/Union members, Annotated's inner type."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _flatten(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) for t in _flatten(a)]
    return [tp]


def _is_model(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field_type(model: type[BaseModel], key: str):
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return f.annotation
    return None


def _step(tp, part):
    """The type one step down a pydantic error path: a field, a dict's value, a list's item, or the member
    of a union pydantic names by its class (`targets.0.TargetProfile.pools`)."""
    for t in _flatten(tp):
        if _is_model(t) and isinstance(part, str):
            inner = _field_type(t, part)
            if inner is not None:
                return inner
        origin = typing.get_origin(t)
        if origin is dict and not isinstance(part, int):
            return typing.get_args(t)[1]
        if origin is list and isinstance(part, int):
            return typing.get_args(t)[0]
    for t in _flatten(tp):
        if _is_model(t) and part == t.__name__:
            return t
    return None


def allowed_keys(model: type[BaseModel], path: tuple) -> list[str]:
    """The keys a mapping at `path` (a pydantic error location, without the key itself) may have."""
    tp = model
    for part in path:
        tp = _step(tp, part)
        if tp is None:
            return []
    keys: list[str] = []
    for t in _flatten(tp):
        if _is_model(t):
            keys += [f.alias or name for name, f in t.model_fields.items()]
    return keys
