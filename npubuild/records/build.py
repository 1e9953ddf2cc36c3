"""A build's records: the outcome of a task in a run, the status of a stage and of a build in the report,
one Skip (a stage not run for a reason, decided when the plan is made or when the stage runs), a stage's
completion record (stage.json) and its entry in a build's report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    """What became of a task in a run (run.json, the progress table)."""

    RAN = "ran"
    FROM_CACHE = "from-cache"  # restored from the shared cache
    CACHED = "cached"  # up to date in the build dir
    FAILED = "failed"
    BLOCKED = "blocked"  # not run: an upstream task failed
    NOT_RUN = "not-run"  # not reached: the run stopped first (a failure without --keep-going, Ctrl-C)

    @property
    def current(self) -> bool:
        """Whether the task's record is this run's word on it: it ran, was restored, or was checked up to date
        (its inputs and outputs compared with what it recorded). A record of any other task is an earlier
        run's, whatever its key says: its inputs may have changed since (a model edited in place)."""
        return self in (Outcome.RAN, Outcome.FROM_CACHE, Outcome.CACHED)


class Status(StrEnum):
    """A stage's or a build's status in report.json. A stage is passed, failed or skipped; a build that passed
    says where its work runs as well (report/status.py decides it): `passed` on the NPU, `passed (mostly host)`
    with fewer than half its nodes there, `passed (host only)` with no NPU partition at all."""

    PASSED = "passed"
    MOSTLY_HOST = "passed (mostly host)"
    HOST_ONLY = "passed (host only)"
    FAILED = "failed"
    SKIPPED = "skipped"

    @property
    def ok(self) -> bool:
        """One of the passes: the build is usable as built (its status says where it runs)."""
        return self in (Status.PASSED, Status.MOSTLY_HOST, Status.HOST_ONLY)


@dataclass(frozen=True)
class Skip:
    """A stage that does not run for a build, for a reason the report shows: planned so (a stage's plan returns
    it) or found so when it runs (its metrics are `to_json()`: npu-sim on an artifact it does not model, the FVP
    on a split model)."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"skipped": True, "reason": self.reason}

    @classmethod
    def from_metrics(cls, metrics: Any) -> Skip | None:
        """The skip a stage's metrics record, or None if it ran."""
        if isinstance(metrics, Mapping) and metrics.get("skipped") is True:
            return cls(str(metrics.get("reason", "")))
        return None


@dataclass(frozen=True)
class StageRecord:
    """A task's stage.json, written last: its presence with the task's key marks the task complete."""

    stage: str
    task: str
    key: str
    cache_key: str | None
    from_cache: bool
    run_id: str
    seconds: float
    metrics: Mapping[str, Any]
    config: Mapping[str, Any]
    outputs: Mapping[str, Mapping[str, Any]]  # file relative to the stage dir -> {size, sha256}

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "task": self.task, "key": self.key, "cache_key": self.cache_key,
                "from_cache": self.from_cache, "run_id": self.run_id, "seconds": self.seconds,
                "metrics": self.metrics, "config": self.config, "outputs": self.outputs}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageRecord:
        return cls(d["stage"], d["task"], d["key"], d.get("cache_key"), bool(d.get("from_cache")), d["run_id"],
                   d["seconds"], d.get("metrics") or {}, d.get("config") or {}, d.get("outputs") or {})

    @property
    def skip(self) -> Skip | None:
        return Skip.from_metrics(self.metrics)


@dataclass(frozen=True)
class StageEntry:
    """One stage of a build in report.json."""

    status: Status
    seconds: float | None = None
    cached: bool = False
    from_cache: bool | None = None  # only for a stage that ran or was restored
    error: str | None = None  # a failed stage's message
    reason: str | None = None  # a skipped stage's reason, where the plan or the stage decided so (not a failure)
    # why a stage that should have run did not in this run (an upstream task failed, the run stopped first):
    # the build is not built, and no record of an earlier run stands in for this one
    not_run: str | None = None

    @classmethod
    def of(cls, record: StageRecord, run_id: str) -> StageEntry:
        """A stage whose record is there: passed, or skipped for the reason its metrics give."""
        skip = record.skip
        return cls(Status.SKIPPED if skip else Status.PASSED, record.seconds, record.run_id != run_id,
                   record.from_cache, reason=skip.reason if skip else None)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": str(self.status), "seconds": self.seconds, "cached": self.cached}
        if self.from_cache is not None:
            d["from_cache"] = self.from_cache
        if self.error is not None:
            d["error"] = self.error
        if self.reason is not None:
            d["reason"] = self.reason
        if self.not_run is not None:
            d["not_run"] = self.not_run
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StageEntry:
        return cls(Status(d["status"]), d.get("seconds"), bool(d.get("cached")), d.get("from_cache"),
                   d.get("error"), d.get("reason"), d.get("not_run"))


@dataclass(frozen=True)
class BuildEntry:
    """One spec x model x target in report.json: what the report, the baseline comparison, JUnit and the HTML
    page read. `extra` keeps what other writers add (debug-numerics' layer_numerics, unchecked_gates...)."""

    spec: str
    model: str
    target: str
    accelerator: str
    status: Status
    stages: Mapping[str, StageEntry]
    metrics: Mapping[str, Any]
    gates: tuple[Mapping[str, Any], ...]
    errors: tuple[str, ...] = ()
    error_kinds: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # what passed but is not what it seems (most of the model on the host)

    @property
    def id(self) -> str:
        return f"{self.spec}/{self.model}/{self.target}"

    KEYS = ("spec", "model", "target", "accelerator", "status", "stages", "metrics", "gates", "errors",
            "error_kinds", "artifacts", "warnings")

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "model": self.model, "target": self.target, "accelerator": self.accelerator,
                "status": str(self.status), "stages": {k: s.to_json() for k, s in self.stages.items()},
                "metrics": dict(self.metrics), "gates": [dict(g) for g in self.gates], "errors": list(self.errors),
                "error_kinds": list(self.error_kinds), "warnings": list(self.warnings), "artifacts": dict(self.artifacts),
                **self.extra}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BuildEntry:
        return cls(d["spec"], d["model"], d["target"], d["accelerator"], Status(d["status"]),
                   {k: StageEntry.from_json(s) for k, s in d["stages"].items()}, d.get("metrics") or {},
                   tuple(d.get("gates") or ()), tuple(d.get("errors") or ()), tuple(d.get("error_kinds") or ()),
                   d.get("artifacts") or {}, {k: v for k, v in d.items() if k not in cls.KEYS},
                   tuple(d.get("warnings") or ()))
