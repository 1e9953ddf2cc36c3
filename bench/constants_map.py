"""Where the bytes of Vela's constant area go: which NPU operations read each byte of a raw output's weight data.

    PYTHONPATH=. /work/main/.venv/bin/python bench/constants_map.py A_vela.npz [B_vela.npz ...]

A benchmark script, not part of npubuild. Vela's "off-chip used" is one number; this splits it by what reads it,
decoding the command stream with npubuild's npu-sim decoder (npubuild/npusim/cmdstream.py): a conv's or
depthwise's weights and scales (WEIGHT_BASE/LENGTH, SCALE_BASE/LENGTH), the DMAs Vela issues from the constant
region (look-up tables, weights buffered into SRAM), and constant elementwise operands (IFM/IFM2 in the weight
region; counted as 64 bytes each, the operand's size is not in the command). Each byte is charged to the first
operation that reads it; bytes no operation reads are "unread". Raw outputs (`--output-format raw`) of U55/U65
streams only. Prints one Markdown table, a column per file.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from npubuild.npusim.cmdstream import Command, decode  # noqa: E402
from npubuild.npusim.npz import load_raw  # noqa: E402

OPERAND_GUESS = 64  # bytes charged to a constant elementwise operand (its size is in the TOSA, not the command)


def spans(cmd: Command, region: int) -> list[tuple[str, int, int]]:
    """(what, start, length) of every read this operation makes from the constant region."""
    r = cmd.regs
    out = []
    if cmd.kind in ("CONV", "DEPTHWISE"):
        if r.get("WEIGHT_REGION", 0) & 7 == region:
            out.append((f"{cmd.kind.lower()} weights", cmd.addr("WEIGHT_BASE"), r.get("WEIGHT_LENGTH", 0)))
        if r.get("SCALE_REGION", 0) & 7 == region:
            out.append((f"{cmd.kind.lower()} scales", cmd.addr("SCALE_BASE"), r.get("SCALE_LENGTH", 0)))
    if cmd.kind == "ELEMENTWISE" and r.get("IFM2_REGION", 0) & 7 == region and not r.get("IFM2_SCALAR", 0) & 1:
        out.append(("elementwise constant operand", cmd.addr("IFM2_BASE0"), OPERAND_GUESS))
    if cmd.kind in ("ELEMENTWISE", "POOL", "CONV", "DEPTHWISE") and r.get("IFM_REGION", 0) & 7 == region:
        out.append(("constant input", cmd.addr("IFM_BASE0"), OPERAND_GUESS))
    if cmd.kind == "DMA_START" and r.get("DMA0_SRC_REGION", 0) & 7 == region:
        out.append(("DMA (look-up tables, buffered weights)", cmd.addr("DMA0_SRC"), r.get("DMA0_LEN", 0)))
    return out


def constant_map(path: Path) -> dict[str, int]:
    """Bytes of the weight data per reader kind, each byte charged once; 'unread' the rest, 'total' all."""
    model = load_raw(path)
    taken = np.zeros(len(model.weights), bool)
    bytes_of: collections.Counter[str] = collections.Counter()
    for cmd in decode(model.commands, str(path)):
        for what, start, length in spans(cmd, model.weight_region):
            end = min(start + length, len(taken))
            if start < end:
                bytes_of[what] += int((~taken[start:end]).sum())
                taken[start:end] = True
    bytes_of["unread"] = int((~taken).sum())
    bytes_of["total"] = len(taken)
    return dict(bytes_of)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("npz", nargs="+", type=Path, help="Vela raw outputs (<name>_vela.npz)")
    args = ap.parse_args()
    maps = [constant_map(p) for p in args.npz]
    kinds = sorted({k for m in maps for k in m} - {"total", "unread"}) + ["unread", "total"]
    print("| bytes read by | " + " | ".join(p.name for p in args.npz) + " |")
    print("|---|" + "---:|" * len(maps))
    for k in kinds:
        print(f"| {k} | " + " | ".join(str(m.get(k, 0)) for m in maps) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
