"""What Vela compiled for one NPU partition, read from its .tflite: the driver payload (command stream), the
constants, the arena and fast-scratch sizes, and where each input and output sits.

The vela stage runs Vela once per partition, with `--output-format tflite`: the deployable is made of that
file's ethos-u operator (deploy/assemble.py), and the pool check, the firmware files and npu-sim read this
record of it. A spec asking for Vela's raw output gets its .npz written from the record (`write_npz`): the
arrays Vela's own raw writer gives for the same compile, key for key (tests/npusim/test_tflite_artifact.py compares
them on U55, U65 and U85), where the stage used to run Vela a second time for them. Read from the flatbuffer,
the constants keep their trailing zero bytes, which an .npz's byte-string arrays drop on `.item()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.npz import TensorPlace
from npubuild.npusim.tflite import READ_ONLY, SCRATCH, SCRATCH_FAST, npu_operators

RAW_RANK = 6  # Vela's raw output pads every I/O shape to six dimensions, leading 1s


@dataclass(frozen=True)
class VelaArtifact:
    command_stream: bytes  # the driver payload: COP1 header, then the command words
    constants: bytes
    arena_bytes: int  # the scratch tensor (the arena the command stream addresses as region 1)
    fast_scratch_bytes: int  # the arena cache's fast scratch (0 without one: Shared_Sram, Sram_Only)
    inputs: tuple[TensorPlace, ...]
    outputs: tuple[TensorPlace, ...]
    fast_region: int  # SCRATCH_FAST with a fast scratch of its own; Vela's raw output says 0 without one
    weight_region: int = READ_ONLY
    scratch_region: int = SCRATCH

    @classmethod
    def from_tflite(cls, path: Path) -> VelaArtifact:
        """The one ethos-u operator of a Vela .tflite (a partition's compile)."""
        ops = npu_operators(path.read_bytes(), str(path))
        if len(ops) != 1:
            raise StageError(f"Vela wrote {len(ops)} ethos-u operators in {path.name}; the partition is one")
        (op,) = ops
        raw = op.model

        def placed(p) -> TensorPlace:
            return TensorPlace((1,) * (RAW_RANK - len(p.shape)) + tuple(p.shape), p.elem_size, p.region, p.offset)

        return cls(op.payload, raw.weights, raw.scratch_size, raw.fast_size, tuple(placed(p) for p in raw.inputs),
                   tuple(placed(p) for p in raw.outputs), SCRATCH_FAST if op.fast_of_its_own else 0)

    def sizes(self) -> dict[str, int]:
        """What the firmware must place, in bytes (the pool check's roles)."""
        return {"arena_bytes": self.arena_bytes, "fast_scratch_bytes": self.fast_scratch_bytes,
                "constants_bytes": len(self.constants), "command_stream_bytes": len(self.command_stream)}

    def write_npz(self, path: Path) -> None:
        """Vela's raw output format (`--output-format raw`) for this compile. A TOSA graph's I/O carries no
        quantisation in Vela (io.json has it), so each quantisation entry is Vela's 'none'."""
        none = {"quant_type": "none", "scale": np.array([], np.float32), "zero_point": np.array([], np.int32)}

        def quant(n: int) -> np.ndarray:
            entries = np.empty(n, dtype=object)
            for i in range(n):
                entries[i] = dict(none)
            return entries

        with open(path, "wb") as f:
            np.savez(f, cmd_data=self.command_stream, weight_data=self.constants, weight_region=self.weight_region,
                     scratch_shape=[self.arena_bytes], scratch_region=self.scratch_region,
                     scratch_size=self.arena_bytes, scratch_fast_shape=[self.fast_scratch_bytes],
                     scratch_fast_region=self.fast_region, scratch_fast_size=self.fast_scratch_bytes,
                     input_shape=[list(p.shape) for p in self.inputs],
                     input_elem_size=[p.elem_size for p in self.inputs],
                     input_region=[p.region for p in self.inputs], input_offset=[p.offset for p in self.inputs],
                     output_shape=[list(p.shape) for p in self.outputs],
                     output_elem_size=[p.elem_size for p in self.outputs],
                     output_region=[p.region for p in self.outputs],
                     output_offset=[p.offset for p in self.outputs],
                     variable_shape=[], variable_elem_size=[], variable_region=[], variable_offset=[],
                     input_quantization=quant(len(self.inputs)), output_quantization=quant(len(self.outputs)),
                     variable_quantization=[])
