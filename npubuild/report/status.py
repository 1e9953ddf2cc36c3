"""A build's status (records/build.py's Status), the one vocabulary report.json, report.md/html, the summary
line, JUnit and baselines use, and what decides it.

- `passed`: built, every check and gate held, and the NPU does the work (at least half the model's nodes).
- `passed (mostly host)`: built and checked, but fewer than half its nodes run on the NPU: the host's CPU
  does most of the work. Its figures are true; they are not an NPU build's.
- `passed (host only)`: built and checked, with no NPU partition at all: the whole model runs on the host
  (no NPU time, memory or TOSA comparison to report: those metrics are null).
- `failed`: a stage failed or a gate fell short (`errors`, `error_kinds`, the gates say which).
- `skipped`: not built (an earlier task failed, or the run stopped).

The three `passed...` statuses are a pass for exit codes and JUnit (an `npu_offload` gate makes a host
build fail: `expect: {npu_offload: 0.9}`); a baseline that passed on the NPU and now runs mostly on the
host is a regression through npu_offload's threshold and the status change it lists.
"""

from __future__ import annotations

from npubuild.records.build import Status

PASSING = frozenset(s for s in Status if s.ok)
MOSTLY_HOST_BELOW = 0.5  # npu_offload under this: the host runs most of the model


RANK = {Status.FAILED: 0, Status.SKIPPED: 1, Status.HOST_ONLY: 2, Status.MOSTLY_HOST: 3, Status.PASSED: 4}


def worse_status(old: str | None, new: str | None) -> bool:
    """Whether a build that passed (in any form) now passes less well or not at all (a baseline regression)."""
    return passed(old) and RANK.get(new, 0) < RANK[Status(old)]


def passed(status: str | None) -> bool:
    """Whether a report entry's status is one of the passes (the build is usable as built)."""
    return status in PASSING


def placement_status(metrics: dict) -> Status:
    """A passed build's status by where its nodes run: on the NPU, mostly on the host, or only there."""
    if metrics.get("npu_partitions") == 0 or metrics.get("npu_ops") == 0:
        return Status.HOST_ONLY
    offload = metrics.get("npu_offload")
    if isinstance(offload, (int, float)) and offload < MOSTLY_HOST_BELOW:
        return Status.MOSTLY_HOST
    return Status.PASSED


MAX_CAUSES = 4
FOLLOWER_RULES = frozenset({"host-value"})  # placed on the host only because a node before them is


def host_warning(metrics: dict, below: float | None) -> str | None:
    """'most of the model runs on the host (NPU 0%): If 'x' (no-lowering: ...)' when npu_offload is under
    `below`, naming the host nodes that are there on their own account (not the ones that follow them)."""
    offload = metrics.get("npu_offload")
    if below is None or not isinstance(offload, (int, float)) or offload >= below:
        return None
    host = [o for o in metrics.get("offloads") or [] if o.get("kind") != "npu"]
    causes = [o for o in host if o.get("rule") not in FOLLOWER_RULES] or host
    named = "; ".join(f"{o['op_type']} '{o['node']}' ({o.get('rule') or 'host'}: {o.get('reason') or '-'})"
                      for o in causes[:MAX_CAUSES])
    more = f"; and {len(causes) - MAX_CAUSES} more" if len(causes) > MAX_CAUSES else ""
    nodes = sum(o.get("nodes", 1) for o in host)
    return (f"most of the model runs on the host (NPU {offload:.0%} of its nodes, "
            f"{nodes} on the host{_mac_share(metrics)}), caused by: {named or 'no NPU partition'}{more}")


def _mac_share(metrics: dict) -> str:
    """'; the host 2.4% of its multiply-accumulates' where both sides' are counted: a float tail of many small
    nodes is most of the nodes and little of the work (the melspectrogram's: 12 of 21 nodes, 65792 of 2.7 M)."""
    host, npu = metrics.get("host_macs"), metrics.get("macs")
    if not isinstance(host, int) or not isinstance(npu, int) or host + npu <= 0:
        return ""
    return f"; the host {host / (host + npu):.1%} of its multiply-accumulates"
