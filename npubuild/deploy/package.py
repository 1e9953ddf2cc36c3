"""The vela stage's deployable: the .tflite, its C array, and what the manifest says of each partition.

A Cortex-M host runs the deployable in TensorFlow Lite Micro (the ethos-u operators through the Ethos-U
driver, the rest as TFLite builtins); a host partition with no builtin translation is "not deployable on a
Cortex-M", which fails a Cortex-M target's build and is reported on a Cortex-A one, whose host runs that
partition's ONNX file in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npubuild.config.schema import TargetProfile
from npubuild.deploy.assemble import Deployable, assemble
from npubuild.deploy.virtual_device import HostRun, VirtualDevice
from npubuild.fileio import write_text
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import PartitionRecord, Where

DEPLOYABLE = "npubuild_deployable"


@dataclass
class Packaged:
    """What the manifest and the report take from the deployable."""

    files: dict[str, str | int] = field(default_factory=dict)  # tflite / source / header (stage dir relative), bytes
    partitions: dict[int, dict] = field(default_factory=dict)  # index -> runs_on, builtins, arena
    tflm_arena_bytes: int | None = None
    npu_arena_bytes: int | None = None
    cortex_m_deployable: bool = True
    not_deployable: list[str] = field(default_factory=list)
    inputs: list[IOSpec] = field(default_factory=list)
    outputs: list[IOSpec] = field(default_factory=list)

    def failure(self, profile: TargetProfile) -> str | None:
        """The stage's one line when the target's host cannot run what the build deploys."""
        if self.cortex_m_deployable or profile.host.kind != "cortex-m":
            return None
        return (f"not deployable on a Cortex-M ({profile.host.cpu}): {self.not_deployable[0]}; a target whose host "
                "is a Cortex-A (host: {kind: cortex-a}) runs that partition in onnxruntime")


def hex_rows(data: bytes) -> list[str]:
    """`0x12, 0x34, ...` 16 bytes to a row: the whole text made by bytes.hex at once and cut into rows (a format
    per byte was most of the vela stage's own CPU: palm detection's deployable is 1.2 MB of it, PP-OCRv4 rec's
    2.6 MB). Each byte is 6 characters of it ("0x12, "), a row of 16 is 94 and the ", " after it."""
    text = "0x" + data.hex(",").replace(",", ", 0x") if data else ""
    return [text[i:i + 94] for i in range(0, len(text), 96)]


def hex_text(data: bytes, sep: str) -> str:
    """`sep.join(hex_rows(data))`, the rows of 16 bytes written into one array by numpy: every row is the same
    94 characters and `sep` with the 32 hex digits in place, so the digits are all that is copied per byte
    (hex_rows cut and joined 75 000 rows for palm detection's deployable, three times a vela stage: 2.5x the
    CPU of this). `sep` is ASCII; a row the rows' 2-byte digit pairs cannot align in (an odd width) and the
    last, short row go through hex_rows."""
    full = len(data) // 16
    end = sep.encode("ascii")
    width = 94 + len(end)
    if not full or width % 2:
        return sep.join(hex_rows(data))
    rows = np.empty((full, width), np.uint8)
    rows[:] = np.frombuffer(b"0x00, " * 15 + b"0x00" + end, np.uint8)
    # each byte's two digits are one uint16 at every third of a row's uint16s from the second (6 chars a byte)
    rows.view(np.uint16)[:, 1:48:3] = np.frombuffer(data[:full * 16].hex().encode("ascii"), np.uint16).reshape(
        full, 16)
    rest = hex_rows(data[full * 16:])
    flat = rows.reshape(-1)
    return str(flat.data, "ascii") + sep.join(rest) if rest else str(flat[:-len(end)].data, "ascii")


def c_array(data: bytes, symbol: str) -> tuple[str, str]:
    """(header, source) holding `data` as a 16-byte aligned const array, as TFLite Micro applications embed it."""
    header = (f"/* {symbol}: the build's deployable .tflite (npubuild) */\n#pragma once\n#include <stddef.h>\n"
              f"#include <stdint.h>\n\nextern const uint8_t {symbol}[];\nextern const size_t {symbol}_len;\n")
    source = (f'#include "{symbol}.h"\n\n__attribute__((aligned(16))) const uint8_t {symbol}[] = {{\n  '
              + hex_text(data, ",\n  ") + f"\n}};\nconst size_t {symbol}_len = {len(data)};\n")
    return header, source


def _measure_host_arenas(data: bytes, inputs: Sequence[IOSpec]) -> list[HostRun]:
    """Each run of host operators with TFLite Micro's arena for it, measured by running the virtual device once
    on zeros (its RecordingMicroAllocator's total)."""
    device = VirtualDevice(data)
    runs = [s for s in device.steps if isinstance(s, HostRun)]
    if runs:
        device.run([np.zeros(s.shape, np.dtype(s.dtype)) for s in inputs])
    return runs


def package(firmware_dir: Path, profile: TargetProfile, partitions: Sequence[PartitionRecord],
            inputs: Sequence[IOSpec], outputs: Sequence[IOSpec], lower_dir: Path,
            vela_tflite: dict[int, Path]) -> Packaged:
    firmware_dir.mkdir(parents=True, exist_ok=True)
    d: Deployable = assemble(partitions, inputs, outputs, lower_dir, vela_tflite)
    out = Packaged(npu_arena_bytes=d.npu_arena_bytes or None, inputs=d.inputs, outputs=d.outputs)
    host_runs_on = "onnxruntime" if profile.host.kind == "cortex-a" else "tflite-micro"
    for r in d.partitions:
        entry: dict = {"runs_on": "ethos-u" if r.kind == Where.NPU else host_runs_on}
        if r.kind == Where.HOST:
            if r.not_deployable:
                entry.update(runs_on="onnxruntime" if profile.host.kind == "cortex-a" else None,
                             not_deployable_on_cortex_m=r.not_deployable)
                out.not_deployable.append(r.not_deployable)
            elif r.builtins:
                entry["tflite_builtins"] = r.builtins
        if r.arena_bytes is not None:
            entry["arena_bytes"] = r.arena_bytes
        out.partitions[r.index] = entry
    if d.data is None:
        out.cortex_m_deployable = False
        return out
    tflite = firmware_dir / f"{DEPLOYABLE}.tflite"
    tflite.write_bytes(d.data)
    header, source = c_array(d.data, DEPLOYABLE)
    write_text(firmware_dir / f"{DEPLOYABLE}.h", header)
    write_text(firmware_dir / f"{DEPLOYABLE}.c", source)
    rel = firmware_dir.name
    out.files = {"tflite": f"{rel}/{DEPLOYABLE}.tflite", "source": f"{rel}/{DEPLOYABLE}.c",
                 "header": f"{rel}/{DEPLOYABLE}.h", "bytes": len(d.data)}
    runs = _measure_host_arenas(d.data, d.inputs) if any(p.kind == Where.HOST for p in partitions) else []
    for r in d.partitions:
        sizes = [run.arena_bytes for run in runs if run.arena_bytes is not None and set(run.ops) & set(r.ops)]
        if r.kind == Where.HOST and sizes:
            out.partitions[r.index]["arena_bytes"] = max(sizes)
    out.tflm_arena_bytes = max((run.arena_bytes for run in runs if run.arena_bytes is not None), default=None)
    return out
