"""The Ethos-U accelerators and what npubuild knows of each, in one place: the tables below, and an accelerator
configuration parsed once from Vela's name for it (`ethos-u55-128`).

Two groupings matter and are easy to confuse, so each has its own name and table here:
- a generation (u55, u65, u85: `GENERATIONS`) is the hardware: its MAC configurations, the command stream
  npu-sim models, the Vela system-config section that models its bus, the Corstone FVP that runs it and
  which TOSA support rules apply (U65 runs U55's TOSA op set and command stream).
- a lowering family (u55, u65, u85, u85wide: `FAMILIES`) is which equivalent TOSA forms npubuild emits.
  U65 and the wide U85s (1024 and 2048 MACs) get their own, since a wider MAC array and AXI ports change
  which of two equivalent forms Vela runs faster (lowering/options.py).
`PLATFORMS` holds the Corstone FVPs' command-line facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Literal

Generation = Literal["u55", "u65", "u85"]
LoweringFamily = Literal["u55", "u65", "u85", "u85wide"]
Rules = Literal["u55", "u85"]  # whose TOSA support rules apply (ethosu/support.py)
CommandStream = Literal["u55", "u85"]  # whose command stream Vela writes (npusim/u55, npusim/u85)


@dataclass(frozen=True)
class GenerationFacts:
    name: Generation
    display: str  # Ethos-U55
    configs: Mapping[int, int]  # MACs per cycle -> NPU cores, every configuration Vela 5.2 accepts
    product: int  # the product field of the driver header's CONFIG word in Vela's raw output
    command_stream: CommandStream
    rules: Rules
    # Vela 5.2's C++ core gives a system config whose name starts with `Ethos_U55` the U55's AXI width and any
    # other name the wide bus of U65/U85: npubuild names its section after the generation (ethosu/vela_ini.py)
    # and models the bandwidth the same way (ethosu/perf.py)
    vela_system_config: str
    axi_bytes: int  # AXI bytes per NPU cycle per port, as Vela models the section above
    ports_used: bool  # whether vela.ini's <memory>_ports_used applies (U85 only)
    fvp: Mapping[str, str]  # Corstone platform -> the FVP executable that models this generation there
    wide_macs: int | None = None  # from this many MACs up, the lowering family is the generation's wide one


GENERATIONS: Mapping[Generation, GenerationFacts] = {
    "u55": GenerationFacts("u55", "Ethos-U55", {32: 1, 64: 1, 128: 1, 256: 1}, 0, "u55", "u55",
                           "Ethos_U55_npubuild", 8, False, {"corstone-300": "FVP_Corstone_SSE-300_Ethos-U55"}),
    "u65": GenerationFacts("u65", "Ethos-U65", {256: 1, 512: 2}, 1, "u55", "u55",
                           "Ethos_U65_npubuild", 16, False, {"corstone-300": "FVP_Corstone_SSE-300_Ethos-U65"}),
    "u85": GenerationFacts("u85", "Ethos-U85", {128: 1, 256: 1, 512: 2, 1024: 4, 2048: 4}, 2, "u85", "u85",
                           "Ethos_U85_npubuild", 16, True, {"corstone-320": "FVP_Corstone_SSE-320"}, wide_macs=1024),
}


@dataclass(frozen=True)
class FamilyFacts:
    name: LoweringFamily
    display: str  # `npubuild ops`' column names
    generation: Generation
    measured_on: str  # the shipped target profile its measured lowering choices are measured on (ethosu/measured.py)

    @property
    def rules(self) -> Rules:
        return GENERATIONS[self.generation].rules


FAMILIES: Mapping[LoweringFamily, FamilyFacts] = {
    "u55": FamilyFacts("u55", "Ethos-U55", "u55", "ethos-u55-128"),
    "u65": FamilyFacts("u65", "Ethos-U65", "u65", "ethos-u65-256"),
    "u85": FamilyFacts("u85", "Ethos-U85 128-512", "u85", "ethos-u85-256"),
    "u85wide": FamilyFacts("u85wide", "Ethos-U85 1024/2048", "u85", "ethos-u85-1024"),
}
LOWERING_FAMILIES: tuple[LoweringFamily, ...] = tuple(FAMILIES)


@dataclass(frozen=True)
class PlatformFacts:
    """A Corstone platform's FVP command line: its board's parameter prefix, where the NPU's MAC count is set,
    the CPU --data loads files into, and the extra parameters it needs to run headless."""

    board: str
    macs_param: str
    data_target: str
    headless: tuple[str, ...] = ()


PLATFORMS: Mapping[str, PlatformFacts] = {
    "corstone-300": PlatformFacts("mps3_board", "ethosu.num_macs", "mps3_board.cpu0"),
    "corstone-320": PlatformFacts("mps4_board", "mps4_board.subsystem.ethosu.num_macs", "mps4_board.subsystem.cpu0",
                                  ("vis_hdlcd.disable_visualisation=1",)),
}

# every accelerator configuration Vela 5.2 accepts, in the tables' order (config/schema.py's Accelerator)
ACCELERATOR_NAMES: tuple[str, ...] = tuple(f"ethos-{g}-{m}" for g, facts in GENERATIONS.items() for m in facts.configs)


@dataclass(frozen=True)
class Accelerator:
    name: str
    generation: Generation
    macs: int  # MACs per cycle

    @staticmethod
    @cache
    def parse(name: str) -> Accelerator:
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "ethos" or parts[1] not in GENERATIONS or not parts[2].isdigit():
            raise ValueError(f"unknown Ethos-U accelerator '{name}'")
        return Accelerator(name, parts[1], int(parts[2]))  # type: ignore[arg-type]

    @property
    def facts(self) -> GenerationFacts:
        return GENERATIONS[self.generation]

    @property
    def lowering_family(self) -> LoweringFamily:
        wide = self.facts.wide_macs
        return f"{self.generation}wide" if wide is not None and self.macs >= wide else self.generation  # type: ignore[return-value]

    @property
    def rules(self) -> Rules:
        """Whose TOSA support rules apply (ethosu.support)."""
        return self.facts.rules

    @property
    def cores(self) -> int:
        return self.facts.configs[self.macs]


def rules_of(family: LoweringFamily) -> Rules:
    """The support rules of a lowering family: U65 has U55's, the wide U85s U85's."""
    return FAMILIES[family].rules


def from_driver_header(product: int, log2_macs: int) -> Accelerator | None:
    """The accelerator a Vela raw output's driver header names (its product and log2 MACs per cycle)."""
    for g, facts in GENERATIONS.items():
        if facts.product == product and (1 << log2_macs) in facts.configs:
            return Accelerator.parse(f"ethos-{g}-{1 << log2_macs}")
    return None
