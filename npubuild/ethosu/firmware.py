"""Firmware-ready output: a deployment manifest (JSON) and a C header/source pair per NPU partition.

Everything comes from what was compiled (the ethos-u operator of Vela's .tflite: ethosu/artifact.py; the
lowered graph's I/O quantisation; the target profile's pools and memory mode), so firmware
built against these files cannot disagree with the compile: the command
stream and constants are embedded byte for byte, and the arena and fast
scratch sizes, region map, I/O offsets and quantisation are constants.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from npubuild.config.schema import TargetProfile, VelaOptions
from npubuild.deploy.package import hex_text
from npubuild.errors import StageError
from npubuild.ethosu.artifact import VelaArtifact
from npubuild.ethosu.vela_ini import arena_cache_bytes, memory_mode_name
from npubuild.fileio import write_json, write_text
from npubuild.npusim.npz import TensorPlace
from npubuild.records.iospec import GraphIO, IOSpec
from npubuild.records.lower import PartitionRecord, Where

# The Ethos-U driver's base-pointer regions as Vela's raw output numbers them.
REGION_ROLES = {0: "constants", 1: "arena", 2: "fast_scratch"}


def c_ident(text: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return ident if re.match(r"[A-Za-z_]", ident) else f"m_{ident}"


def _io_entries(places: Sequence[TensorPlace], kind: str, specs: Sequence[IOSpec]) -> list[dict]:
    if len(places) != len(specs):  # Vela left out a graph input it does not read (nothing maps it)
        raise StageError(f"Vela's ethos-u operator has {len(places)} {kind}s where the TOSA graph has "
                         f"{len(specs)} ({', '.join(s.onnx_name for s in specs)}): the firmware's {kind} map "
                         "cannot be written")
    return [{"name": spec.onnx_name, "region": p.region, "offset": p.offset, "shape": list(p.shape),
             "elem_size": p.elem_size, "size": p.nbytes, "dtype": spec.dtype, "layout": spec.layout,
             "scale": spec.scale, "zero_point": spec.zero_point} for p, spec in zip(places, specs, strict=True)]


def manifest(art: VelaArtifact, io: GraphIO, profile: TargetProfile, opts: VelaOptions) -> dict:
    """What the firmware must provide and where, from the compiled artifact and the profile."""
    p = profile.placement
    pool_of = {"constants": p.constants, "arena": p.arena, "fast_scratch": p.cache}
    sizes = {"constants": len(art.constants), "arena": art.arena_bytes, "fast_scratch": art.fast_scratch_bytes}
    regions = {art.weight_region: "constants", art.scratch_region: "arena"}
    if sizes["fast_scratch"] > 0:  # without an arena cache (Shared_Sram, Sram_Only) there is no such region
        regions[art.fast_region] = "fast_scratch"
    region_list = []
    for idx, role in sorted(regions.items()):
        pool = profile.pools[pool_of[role]]
        region_list.append({"region": idx, "role": role, "size": sizes[role], "pool": pool_of[role],
                            "kind": pool.kind, "port": pool.port})
    return {
        "accelerator": profile.accelerator,
        "target": profile.name,
        "platform": profile.platform,
        "clock_hz": int(profile.clock_mhz * 1e6),
        "memory_mode": memory_mode_name(profile),
        "arena_cache_size": arena_cache_bytes(profile),
        "vela_options": opts.model_dump(),
        "command_stream_size": len(art.command_stream),
        "constants_size": sizes["constants"],
        "arena_size": sizes["arena"],
        "fast_scratch_size": sizes["fast_scratch"],
        "regions": region_list,
        "inputs": _io_entries(art.inputs, "input", io.inputs),
        "outputs": _io_entries(art.outputs, "output", io.outputs),
    }


def _bytes_c(data: bytes) -> str:
    """A C array's initialiser: hex_text, or one zero byte for no data (C has no empty initialiser)."""
    return hex_text(data, ",\n    ") if data else "0x00"


def _io_c(entries: list[dict]) -> str:
    if not entries:
        return "    {0}"
    rows = []
    for e in entries:
        shape = ", ".join(str(d) for d in (e["shape"] + [1] * 6)[:6])
        scale = e["scale"] if e["scale"] is not None else 0.0
        zp = e["zero_point"] if e["zero_point"] is not None else 0
        rows.append(f'    {{"{c_escape(e["name"])}", {e["region"]}u, {e["offset"]}u, {e["size"]}u, '
                    f'{e["elem_size"]}u, {{{shape}}}, {float(scale)!r}f, {int(zp)}}}')
    return ",\n".join(rows)


def c_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def render_c(prefix: str, man: dict, cmd: bytes, constants: bytes) -> tuple[str, str]:
    """(header, source) for one compiled partition; every symbol starts with `prefix`."""
    up = prefix.upper()
    regions = "\n".join(f"#define {up}_REGION_{r['role'].upper()} {r['region']}u  /* {r['pool']} ({r['kind']}, "
                        f"{r['port']}) */" for r in man["regions"])
    header = f"""/* Generated by npubuild for target '{man['target']}' ({man['accelerator']}); do not edit. */
#ifndef {up}_H
#define {up}_H

#include <stddef.h>
#include <stdint.h>

#define {up}_ACCELERATOR "{man['accelerator']}"
#define {up}_MEMORY_MODE "{man['memory_mode']}"
#define {up}_CLOCK_HZ {man['clock_hz']}u
#define {up}_ARENA_CACHE_SIZE {man['arena_cache_size']}u
#define {up}_COMMAND_STREAM_SIZE {man['command_stream_size']}u
#define {up}_CONSTANTS_SIZE {man['constants_size']}u
#define {up}_ARENA_SIZE {man['arena_size']}u
#define {up}_FAST_SCRATCH_SIZE {man['fast_scratch_size']}u
#define {up}_NUM_INPUTS {len(man['inputs'])}u
#define {up}_NUM_OUTPUTS {len(man['outputs'])}u
{regions}

typedef struct {{
    const char *name;
    uint32_t region;      /* base-pointer region the tensor lives in */
    uint32_t offset;      /* byte offset in that region */
    uint32_t size;        /* bytes */
    uint32_t elem_size;   /* bytes per element */
    int32_t shape[6];     /* Vela's shape, NHWC for activations, padded with 1 */
    float scale;          /* quantisation: real = scale * (q - zero_point) */
    int32_t zero_point;
}} {prefix}_io_t;

extern const uint8_t {prefix}_command_stream[];
extern const uint8_t {prefix}_constants[];  /* {up}_CONSTANTS_SIZE bytes */
extern const {prefix}_io_t {prefix}_inputs[];
extern const {prefix}_io_t {prefix}_outputs[];

#endif /* {up}_H */
"""
    source = f"""/* Generated by npubuild for target '{man['target']}' ({man['accelerator']}); do not edit. */
#include "{prefix}.h"

__attribute__((aligned(16))) const uint8_t {prefix}_command_stream[{max(len(cmd), 1)}] = {{
    {_bytes_c(cmd)}
}};

__attribute__((aligned(16))) const uint8_t {prefix}_constants[{max(len(constants), 1)}] = {{
    {_bytes_c(constants)}
}};

const {prefix}_io_t {prefix}_inputs[] = {{
{_io_c(man['inputs'])}
}};

const {prefix}_io_t {prefix}_outputs[] = {{
{_io_c(man['outputs'])}
}};
"""
    return header, source


def write_firmware(out_dir: Path, stem: str, art: VelaArtifact, io: GraphIO, profile: TargetProfile,
                   opts: VelaOptions) -> dict:
    """Write <prefix>.json, <prefix>.h and <prefix>.c; returns their paths and the manifest's sizes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = c_ident(f"npubuild_{stem}")
    man = manifest(art, io, profile, opts)
    header, source = render_c(prefix, man, art.command_stream, art.constants)
    paths = {"manifest": out_dir / f"{prefix}.json", "header": out_dir / f"{prefix}.h",
             "source": out_dir / f"{prefix}.c"}
    write_json(paths["manifest"], man)
    write_text(paths["header"], header)
    write_text(paths["source"], source)
    # paths relative to the stage dir: metrics must not depend on where the build dir is
    return {"prefix": prefix, **{k: f"{out_dir.name}/{v.name}" for k, v in paths.items()},
            "arena_size": man["arena_size"], "fast_scratch_size": man["fast_scratch_size"]}


def write_deployment(out_dir: Path, profile: TargetProfile, partitions: Sequence[PartitionRecord],
                     firmware: dict[int, dict], packaged=None) -> str:
    """The build's deployment manifest: the deployable .tflite (one flatbuffer for TensorFlow Lite Micro) with
    its C array and I/O quantisation, then the partitions in run order, each with what runs it on the device
    (the Ethos-U; TensorFlow Lite Micro and its builtin operators; or onnxruntime on a Cortex-A host) and the
    arena it needs; each NPU one with its C files (command stream and constants alone, for a driver-only
    application), each host one with its ONNX file. Returns its path (relative)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for p in partitions:
        entry: dict = {"index": p.index, "kind": p.kind, "inputs": list(p.inputs), "outputs": list(p.outputs),
                       "nodes": list(p.nodes)}
        if packaged is not None:
            entry.update(packaged.partitions.get(p.index, {}))
        if p.kind == Where.NPU:
            fw = firmware.get(p.index, {})
            entry.update({"prefix": fw.get("prefix"), "manifest": fw.get("manifest"), "header": fw.get("header"),
                          "source": fw.get("source")})
            if fw.get("arena_size") is not None:
                entry.setdefault("arena_bytes", fw["arena_size"])
        else:
            entry["onnx"] = p.file
        parts.append(entry)
    doc: dict = {"target": profile.name, "accelerator": profile.accelerator,
                 "memory_mode": memory_mode_name(profile)}
    if packaged is not None:
        doc["host"] = profile.host.model_dump()
        doc["deployable"] = {**packaged.files, "cortex_m_deployable": packaged.cortex_m_deployable,
                             "not_deployable_on_cortex_m": packaged.not_deployable,
                             "npu_arena_bytes": packaged.npu_arena_bytes,
                             "tflm_host_arena_bytes": packaged.tflm_arena_bytes,
                             "inputs": [_io_entry(s) for s in packaged.inputs],
                             "outputs": [_io_entry(s) for s in packaged.outputs]} if packaged.files or \
            packaged.not_deployable else None
    doc["partitions"] = parts
    path = out_dir / "npubuild_deployment.json"
    write_json(path, doc)
    return f"{out_dir.name}/{path.name}"


def _io_entry(spec: IOSpec) -> dict:
    return {"name": spec.onnx_name, "shape": list(spec.shape), "layout": spec.layout, "dtype": spec.dtype,
            "scale": spec.scale, "zero_point": spec.zero_point}
