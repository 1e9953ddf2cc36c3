"""Memory-pool checks after Vela: the arena, the fast scratch and the constants against their pools.

Vela's compiled artifact (ethosu/artifact.py) gives the exact byte sizes the firmware must provide:
the scratch (the tensor arena), the fast scratch (the arena cache in a Dedicated_Sram memory mode) and the
weights/constants blob.
Each is charged to the pool the profile's placement puts it in; a pool that
holds several (Sram_Only) is charged their sum. The command stream is charged
with the constants: the firmware keeps it as a const array beside the weights,
in the same memory (Vela's own "off-chip flash used" leaves it out: 5 KiB for
ResNet-8, 34 KiB for the 2-layer transformer on U55).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from npubuild.config.schema import MemoryPool, Placement, TargetProfile

KIB = 1024.0


class PoolLayout(Protocol):
    """What a pool check reads of a target: its pools and where the arena, constants and cache go."""

    @property
    def pools(self) -> Mapping[str, MemoryPool]: ...

    @property
    def placement(self) -> Placement: ...


@dataclass(frozen=True)
class TargetPools:
    """A target's name, pools and placement: all a pool check reads of it (the early-fit stage's key holds
    these, so that a target's clock or Vela options do not rerun it)."""

    name: str
    pools: Mapping[str, MemoryPool]
    placement: Placement

    @classmethod
    def of(cls, profile: TargetProfile) -> TargetPools:
        return cls(profile.name, profile.pools, profile.placement)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pools": {k: p.model_dump() for k, p in self.pools.items()},
                "placement": self.placement.model_dump()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TargetPools:
        return cls(d["name"], {k: MemoryPool.model_validate(p) for k, p in d["pools"].items()},
                   Placement.model_validate(d["placement"]))


def pool_usage(profile: PoolLayout, sizes: dict[str, int]) -> list[dict]:
    """Per pool: which roles it holds, the KiB they need, the KiB it has, and whether they fit."""
    p = profile.placement
    roles = [("constants", p.constants, sizes["constants_bytes"]), ("arena", p.arena, sizes["arena_bytes"])]
    if sizes.get("command_stream_bytes"):
        roles.insert(1, ("command_stream", p.constants, sizes["command_stream_bytes"]))
    if p.cache != p.arena:  # in Shared_Sram / Sram_Only the fast scratch is part of the arena (size 0)
        roles.append(("fast_scratch", p.cache, sizes["fast_scratch_bytes"]))
    out = []
    for name, pool in profile.pools.items():
        held = {role: nbytes for role, pool_name, nbytes in roles if pool_name == name}
        need = sum(held.values()) / KIB
        out.append({"pool": name, "kind": pool.kind, "roles": {r: round(b / KIB, 3) for r, b in held.items()},
                    "used_kib": round(need, 3), "size_kib": pool.size_kib, "fits": need <= pool.size_kib})
    if p.arena_cache_kib is not None:
        cached = sizes["fast_scratch_bytes"] if p.cache != p.arena else sizes["arena_bytes"]
        need = cached / KIB
        out.append({"pool": f"{p.cache} (arena cache)", "kind": profile.pools[p.cache].kind,
                    "roles": {"fast_scratch" if p.cache != p.arena else "arena": round(need, 3)},
                    "used_kib": round(need, 3), "size_kib": p.arena_cache_kib, "fits": need <= p.arena_cache_kib})
    return out


def pool_failure(target: str, pools: list[dict]) -> str | None:
    """The one-line error for the first pool that does not fit, or None."""
    for pool in pools:
        if not pool["fits"]:
            roles = ", ".join(f"{r} {k:.1f} KiB" for r, k in pool["roles"].items())
            return (f"target '{target}': pool '{pool['pool']}' ({pool['kind']}) needs {pool['used_kib']:.1f} KiB "
                    f"({roles}) but has {pool['size_kib']:.1f} KiB")
    return None
