"""The precision the spec fixes: model-wide `activations`/`weights`, and `layers` over them (node names or globs).

A layer named in `layers` selects the activation groups it produces (its output and what shares its
quantisation through data movement) and, for a weighted layer, its weights; `activations: float` selects its own
output alone (a float tensor shares no grid), its producer then on the host. A group whose producer has no int16
form on one of the build's families stays int8, with the reason in precision.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from npubuild.config.schema import Quantization
from npubuild.errors import InputError
from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.rewrite import PrecisionPlan, constants_of, promotable


def _matching(names: Iterable[str], pattern: str) -> list[str]:
    return [n for n in names if fnmatchcase(n, pattern)]


def fixed_plan(info: QdqModel, q: Quantization, families: Iterable[str]) -> tuple[PrecisionPlan, dict[str, str]]:
    """The plan the settings ask for and, per group asked for int16 that stays int8, why."""
    families = tuple(families)
    int16 = set(info.groups) if q.activations == "int16" else set()
    int4 = set(info.layers) if q.weights == "int4" else set()
    floats: set[str] = set()
    producers = {layer: g.name for g in info.groups.values() for layer in g.layers}
    by_name = {n.name: n for n in info.model.graph.node}
    nodes = [n.name for n in info.model.graph.node] + list(info.activations)
    for pattern, lp in q.layers.items():
        hits = _matching(nodes, pattern)
        if not hits:
            raise InputError(f"quantization.layers: '{pattern}' matches no node of the model")
        groups = {producers[h] for h in hits if h in producers}
        weighted = {h for h in hits if h in info.layers}
        written = {a.name for h in hits if (n := by_name.get(h)) is not None for a in info.written_activations(n)}
        if lp.activations is not None and not (written if lp.activations == "float" else groups):
            raise InputError(f"quantization.layers: '{pattern}' names no node with a quantised output")
        if lp.weights is not None and not weighted:
            raise InputError(f"quantization.layers: '{pattern}' names no conv or fully connected layer")
        if lp.activations == "float":
            floats |= written
        elif lp.activations == "int16":
            int16 |= groups
        elif lp.activations == "int8":
            int16 -= groups
        if lp.weights == "int4":
            int4 |= weighted
        elif lp.weights == "int8":
            int4 -= weighted
    constants = constants_of(info)
    kept = {g: why for g in sorted(int16) if (why := promotable(info, g, families, constants)) is not None}
    return PrecisionPlan(frozenset(int16 - set(kept)), frozenset(int4), frozenset(floats)), kept
