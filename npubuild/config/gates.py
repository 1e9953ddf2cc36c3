"""Gates: the spec's `expect:` limits checked against a build's metrics (the table is config.metrics.GATES): by the
report stage, and by the TOSA check deciding whether its per-node check must run."""

from __future__ import annotations

from npubuild.config.metrics import GATE_BY_KEY


def evaluate(expect: dict, metrics: dict, defaults: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """Each gate against the build's metrics. A gate the spec set fails on a metric nobody measured (a build
    must not pass on what it did not check); a default gate (`defaults`: the profile's or the pipeline's, not
    set by the spec) is then left out: it asks only what the build measures."""
    gates = []
    for key, limit in expect.items():
        if limit is None or key not in GATE_BY_KEY:
            continue
        gate = GATE_BY_KEY[key]
        value = metrics.get(gate.metric)
        if value is None and key in defaults:
            continue
        if value is None:
            ok = False
        elif gate.compare == "eq":
            ok = value == limit
        elif gate.compare == "min":
            ok = value >= limit
        else:
            ok = value <= limit
        gates.append({"name": key, "metric": gate.metric, "limit": limit, "value": value, "ok": bool(ok),
                      **({"default": True} if key in defaults else {})})
    return gates + precision_budget_gates(metrics)


BUDGET_KEYS = {"min_snr_db": "snr_db", "min_top1_agreement": "top1_agreement"}


def precision_budget_gates(metrics: dict) -> list[dict]:
    """`quantization.budget` of a `precision: auto` build as gates of their own: a plan that misses the accuracy
    the spec asked for (against float on the calibration samples, as the search measured it) fails the build,
    with what it reached."""
    p = metrics.get("precision") or {}
    if "met" not in p:
        return []
    budget, chosen = p.get("budget") or {}, p.get("chosen") or {}
    gates = []
    for key, measured in BUDGET_KEYS.items():
        if budget.get(key) is None:
            continue
        value = chosen.get(measured)
        gates.append({"name": f"quantization.budget.{key}", "metric": f"precision.chosen.{measured}",
                      "limit": budget[key], "value": value, "ok": value is not None and value >= budget[key]})
    return gates
