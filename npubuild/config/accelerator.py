"""An Ethos-U accelerator configuration, parsed once from Vela's name for it (`ethos-u55-128`).

Two groupings matter and are easy to confuse, so each has its own name here:
- `generation` (u55, u65, u85): the hardware; it decides the FVP, the command stream npu-sim models,
  the section name Vela needs to model the bus (vela_ini) and which TOSA support rules apply (`rules`:
  U65 runs U55's TOSA op set).
- `lowering_family` (u55, u65, u85, u85wide): which equivalent TOSA forms npubuild emits. U65 and the
  wide U85s (1024 and 2048 MACs) get their own, since a wider MAC array and AXI ports change which of
  two equivalent forms Vela runs faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

Generation = Literal["u55", "u65", "u85"]
LoweringFamily = Literal["u55", "u65", "u85", "u85wide"]
LOWERING_FAMILIES: tuple[LoweringFamily, ...] = ("u55", "u65", "u85", "u85wide")
U85_WIDE_MACS = 1024  # ethos-u85-1024 and -2048 lower as "u85wide"


@dataclass(frozen=True)
class Accelerator:
    name: str
    generation: Generation
    macs: int  # MACs per cycle

    @staticmethod
    @cache
    def parse(name: str) -> Accelerator:
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "ethos" or parts[1] not in ("u55", "u65", "u85") or not parts[2].isdigit():
            raise ValueError(f"unknown Ethos-U accelerator '{name}'")
        return Accelerator(name, parts[1], int(parts[2]))  # type: ignore[arg-type]

    @property
    def lowering_family(self) -> LoweringFamily:
        return "u85wide" if self.generation == "u85" and self.macs >= U85_WIDE_MACS else self.generation

    @property
    def rules(self) -> Literal["u55", "u85"]:
        """Whose TOSA support rules apply (ethosu.support)."""
        return "u85" if self.generation == "u85" else "u55"


def rules_of(family: LoweringFamily) -> Literal["u55", "u85"]:
    """The support rules of a lowering family: U65 has U55's, the wide U85s U85's."""
    return "u85" if family in ("u85", "u85wide") else "u55"
