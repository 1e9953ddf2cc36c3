"""Gates: the spec's `expect:` limits checked against a build's metrics (the table is config.metrics.GATES): by the
report stage, and by the TOSA check deciding whether its per-node check must run."""

from __future__ import annotations

from npubuild.config.metrics import GATE_BY_KEY


def evaluate(expect: dict, metrics: dict) -> list[dict]:
    gates = []
    for key, limit in expect.items():
        if limit is None or key not in GATE_BY_KEY:
            continue
        gate = GATE_BY_KEY[key]
        value = metrics.get(gate.metric)
        if value is None:
            ok = False
        elif gate.compare == "eq":
            ok = value == limit
        elif gate.compare == "min":
            ok = value >= limit
        else:
            ok = value <= limit
        gates.append({"name": key, "metric": gate.metric, "limit": limit, "value": value, "ok": bool(ok)})
    return gates
