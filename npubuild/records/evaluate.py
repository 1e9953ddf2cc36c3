"""The evaluate stage's evaluate.json: the spec's `evaluate:` metric for the deployed graph, the QDQ model and the
float model, and what ran the deployed graph."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvaluateRecord:
    """One evaluation; `eval_float_score`/`eval_drop` only for metrics not defined against float (top1, a user's);
    a top1 evaluation also fills the older `accuracy`, `float_accuracy` and `accuracy_drop`."""

    eval_metric: str
    eval_score: float | None  # None: the metric found nothing to measure (no float detections)
    eval_qdq_score: float | None
    eval_float_score: float | None
    eval_samples: int
    eval_engine: str  # verify/deployed.Deployed.engine: virtual-device (the deployable) or tosa-reference
    eval_output: str
    eval_engine_note: str | None = None  # why the TOSA graph ran (no deployable, npu-sim does not model it)

    @property
    def eval_drop(self) -> float | None:
        if self.eval_float_score is None or self.eval_score is None:
            return None
        return self.eval_float_score - self.eval_score

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"eval_metric": self.eval_metric, "eval_score": self.eval_score,
                             "eval_qdq_score": self.eval_qdq_score, "eval_float_score": self.eval_float_score,
                             "eval_drop": self.eval_drop, "eval_samples": self.eval_samples,
                             "eval_engine": self.eval_engine, "eval_output": self.eval_output}
        if self.eval_engine_note:
            d["eval_engine_note"] = self.eval_engine_note
        if self.eval_metric == "top1":
            d.update(accuracy=self.eval_score, float_accuracy=self.eval_float_score, accuracy_drop=self.eval_drop)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvaluateRecord:
        return cls(d["eval_metric"], d.get("eval_score"), d.get("eval_qdq_score"), d.get("eval_float_score"),
                   int(d["eval_samples"]), d["eval_engine"], d["eval_output"], d.get("eval_engine_note"))
