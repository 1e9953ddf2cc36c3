"""What this machine holds: its cores (affinity, a container's CPU quota), its memory (MemTotal, a cgroup's
limit) and what one stage task may add to it (the stage memory limit). Facts of the machine, never of its
momentary load, so a build does the same on a busy machine as on an idle one. Read by the engine (how many
tasks at once: engine/capacity.py) and by a stage's worker pools (fanout.py), so it sits below both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MEMORY_ENV = "NPUBUILD_STAGE_MEMORY_MIB"
DEFAULT_MEMORY_MIB = 4096  # address space a stage task's child may add to what it inherits
WORKERS_ENV = "NPUBUILD_STAGE_WORKERS"
CGROUP_FILES = (("/sys/fs/cgroup/cpu.max", None),  # v2: "QUOTA PERIOD" or "max PERIOD"
                ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))  # v1
CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a container's CPU quota (a CI runner's
    cgroup of 2 CPUs on a 64-core host must not start 64 workers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, int(quota))) if quota is not None else cores


def cgroup_cpu_quota(files: tuple[tuple[str, str | None], ...] = CGROUP_FILES) -> float | None:
    """CPUs the cgroup's quota allows (quota / period), or None where there is no quota."""
    for quota_file, period_file in files:
        try:
            fields = Path(quota_file).read_text().split()
            if period_file is not None:
                fields.append(Path(period_file).read_text().strip())
        except OSError:
            continue
        if len(fields) >= 2 and fields[0].lstrip("-").isdigit() and fields[1].isdigit():
            quota, period = int(fields[0]), int(fields[1])
            return quota / period if quota > 0 and period > 0 else None
        return None
    return None


def total_memory_bytes(meminfo: str = "/proc/meminfo", cgroup_files: tuple[str, ...] = CGROUP_MEMORY_FILES) -> int | None:
    """The memory this process's machine has: MemTotal, capped by its cgroup's limit (a container's); None if
    neither can be read (not Linux)."""
    total = None
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    for path in cgroup_files:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
        break
    return total


@dataclass(frozen=True)
class Capacity:
    """What the machine holds: its cores, its memory and what one stage task may add (the stage memory limit)."""

    cores: int
    memory_bytes: int | None
    per_task_bytes: int

    @classmethod
    def here(cls) -> Capacity:
        return cls(available_cores(), total_memory_bytes(), memory_limit_bytes())

    @property
    def by_memory(self) -> int | None:
        """Stage tasks the memory holds at their limit each (at least one: a build always runs)."""
        return None if self.memory_bytes is None else max(1, self.memory_bytes // self.per_task_bytes)

    @property
    def tasks(self) -> int:
        """Stage tasks (or processes doing one's work) that may run at once."""
        return max(1, min(self.cores, self.by_memory or self.cores))

    def describe(self) -> str:
        memory = "" if self.memory_bytes is None else (
            f", {self.memory_bytes / 2**30:.1f} GiB of memory for stage tasks of up to "
            f"{self.per_task_bytes / 2**30:.1f} GiB each (${MEMORY_ENV})")
        return f"{self.cores} core(s){memory}"


def memory_limit_bytes() -> int:
    """A stage task's child's added address space: $NPUBUILD_STAGE_MEMORY_MIB, else DEFAULT_MEMORY_MIB."""
    text = os.environ.get(MEMORY_ENV, "")
    if text.isdigit() and int(text) > 0:
        return int(text) << 20
    return DEFAULT_MEMORY_MIB << 20
