"""The code flash of the ExecuTorch route's CPU part: its kernels compiled for Cortex-M55 with -Os and measured.

    apt-get install -y gcc-arm-none-eabi     # Arm GNU toolchain (Debian bookworm: GCC 12.2.rel1)
    PYTHONPATH=. .venv/bin/python bench/executorch_cpu_code.py --executorch GIT_DIR [--commit SHA] \\
        --work /tmp/et-code --out bench/executorch_cpu_code.json

A benchmark script, not part of npubuild. Where ExecuTorch's route leaves ops on the CPU
(bench/executorch_cpu_memory.json: the U-Nets' bilinear upsample, ResNet-8's average pool, each between a
dequantize and a quantize), Vela's figures count neither the CPU kernels' code nor their memory. The memory is
bench/executorch_cpu_memory.py's; this measures the code. It takes the kernels' sources from an ExecuTorch git
checkout (GIT_DIR, e.g. the `fetch` mirror of github:pytorch/executorch; kernels/portable/cpu and
kernels/quantized/cpu are the same files in v1.4.1 and in main at 1.5.0, the route's 1.5.1 sits between them),
compiles each kernel and the portable utilities it calls with the flags of ExecuTorch's own bare-metal toolchain
file (examples/arm/ethos-u-setup/arm-none-eabi-gcc.cmake: -mcpu=cortex-m55 -mthumb -mfloat-abi=hard
-fno-unwind-tables -fno-rtti -fno-exceptions -fdata-sections -ffunction-sections, NDEBUG, C++17) plus -Os
(EXECUTORCH_OPTIMIZE_SIZE), and links a model's kernels into one relocatable object with --gc-sections rooted at
the `*_out(KernelRuntimeContext&, ...)` entry points its program calls, as a firmware's --gc-sections link keeps
them. arm-none-eabi-size of that object is the figure: .text + .rodata (+ .data) bytes of flash.

Counted: the kernels (op_upsample_bilinear2d / op_avg_pool2d, quantize_per_tensor, dequantize_per_tensor) and
the portable utilities they call (upsample_util, kernel_ops_util, reduce_util), every dtype the kernels' switches
instantiate (no dtype-selective build). Not counted, and said so in the output: the ExecuTorch runtime the
kernels call (executorch::runtime::*: tensor resize, dim-order checks, logging, abort), which the route's
firmware links for its delegates whether or not any op runs on the CPU; the generated registration wrappers
(RegisterCodegenUnboxedKernels: one unboxing function and one table entry per op); the toolchain's libgcc /
newlib helpers the kernels call (64-bit division, float <-> int64 conversions, memset / memmove, abort), measured
separately as `toolchain_bytes` by a full link, since a firmware usually has them already. Two builds each: the
logging of ExecuTorch's arm_baremetal preset (EXECUTORCH_ENABLE_LOGGING ON: the log strings in .rodata) and
ET_LOG_ENABLED=0. bench/size_mode.py counts the smaller (logging off), the route's least code.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = "cortex-m55"
FLAGS = ["-std=c++17", "-Os", f"-mcpu={CPU}", "-mthumb", "-mfloat-abi=hard", "-fno-unwind-tables", "-fno-rtti",
         "-fno-exceptions", "-fdata-sections", "-ffunction-sections", "-DNDEBUG", "-DC10_USING_CUSTOM_GENERATED_MACROS"]
LOGGING = {"logging_on": [], "logging_off": ["-DET_LOG_ENABLED=0"]}
PORTABLE, QUANTIZED = "kernels/portable/cpu", "kernels/quantized/cpu"


@dataclass(frozen=True)
class Kernel:
    """One CPU op of the route's program: the sources its kernel needs and the entry point its program calls."""

    sources: tuple[str, ...]
    entry: str  # torch::executor::native::<entry>(executorch::runtime::KernelRuntimeContext&, ...)


KERNELS = {
    "quantized_decomposed.quantize_per_tensor.default": Kernel((f"{QUANTIZED}/op_quantize.cpp",),
                                                               "quantize_per_tensor_out"),
    "quantized_decomposed.dequantize_per_tensor.default": Kernel(
        (f"{QUANTIZED}/op_dequantize.cpp", f"{PORTABLE}/util/reduce_util.cpp"), "dequantize_per_tensor_out"),
    "aten.upsample_bilinear2d.vec": Kernel(
        (f"{PORTABLE}/op_upsample_bilinear2d.cpp", f"{PORTABLE}/util/upsample_util.cpp"), "upsample_bilinear2d_vec_out"),
    "aten.avg_pool2d.default": Kernel(
        (f"{PORTABLE}/op_avg_pool2d.cpp", f"{PORTABLE}/util/kernel_ops_util.cpp"), "avg_pool2d_out"),
}


@dataclass(frozen=True)
class CodeSize:
    """Loaded bytes of one model's CPU kernels after a --gc-sections link (arm-none-eabi-size sections)."""

    text: int
    rodata: int
    data: int
    bss: int

    @property
    def flash(self) -> int:
        return self.text + self.rodata + self.data


def run(cmd: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"error: {' '.join(cmd[:3])} ...: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    return r.stdout


def checkout(git_dir: Path, commit: str, dest: Path) -> None:
    """The runtime headers and kernel sources at `commit`, under dest/executorch (the include root ExecuTorch uses)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "executorch").mkdir(parents=True)
    tar = subprocess.run(["git", "--git-dir", str(git_dir), "archive", commit, "runtime", PORTABLE, QUANTIZED],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest / "executorch")], input=tar, check=True)


def compile_all(src: Path, out: Path, extra: list[str]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    inc = ["-I", str(src), "-I", str(src / "executorch/runtime/core/portable_type/c10")]
    objs = {}
    for rel in sorted({s for k in KERNELS.values() for s in k.sources}):
        obj = out / (Path(rel).stem + ".o")
        run(["arm-none-eabi-g++", *FLAGS, *extra, *inc, "-c", str(src / "executorch" / rel), "-o", str(obj)])
        objs[rel] = obj
    return objs


def entry_symbol(objs: list[Path], name: str) -> str:
    """The mangled name of native::<name>(KernelRuntimeContext&, ...), the overload the generated wrapper calls."""
    for line in run(["arm-none-eabi-nm", "--defined-only", *map(str, objs)]).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T":
            demangled = run(["arm-none-eabi-c++filt", parts[2]]).strip()
            if demangled.startswith(f"torch::executor::native::{name}(executorch::runtime::KernelRuntimeContext&"):
                return parts[2]
    sys.exit(f"error: no {name}(KernelRuntimeContext&, ...) in the compiled kernels")


def sections(obj: Path) -> CodeSize:
    size = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    for line in run(["arm-none-eabi-size", "-A", str(obj)]).splitlines():
        m = re.match(r"\.(text|rodata|data|bss)(\.\S*)?\s+(\d+)", line)
        if m:
            size[m.group(1)] += int(m.group(3))
    return CodeSize(**size)


def link(objs: list[Path], entries: list[str], out: Path) -> tuple[CodeSize, list[str]]:
    """Kernel objects linked with --gc-sections from the entry points; the undefined symbols left (demangled)."""
    run(["arm-none-eabi-ld", "-r", "--gc-sections", *[a for e in entries for a in ("-u", e)], *map(str, objs),
         "-o", str(out)])
    undefined = run(["arm-none-eabi-nm", "-u", "-C", str(out)]).split("\n")
    names = sorted({u.split("U", 1)[1].strip() for u in undefined if u.strip()})
    missing = [n for n in names if n.startswith("torch::executor::")]
    if missing:
        sys.exit(f"error: kernel utilities not compiled in: {missing[0]}")
    return sections(out), names


def toolchain_bytes(objs: list[Path], entries: list[str], out: Path, kernels_only: CodeSize) -> int:
    """Bytes a full link adds from libgcc / newlib for the kernels' calls (runtime symbols left unresolved)."""
    run(["arm-none-eabi-g++", *FLAGS[1:5], "--specs=nosys.specs", "-nostartfiles", "-Wl,--gc-sections",
         f"-Wl,-e,{entries[0]}", *[f"-Wl,-u,{e}" for e in entries], "-Wl,--unresolved-symbols=ignore-all",
         *map(str, objs), "-lm", "-o", str(out)])
    return sections(out).flash - kernels_only.flash


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executorch", type=Path, required=True, help="an ExecuTorch git dir (bare or .git)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--memory", type=Path, default=ROOT / "bench" / "executorch_cpu_memory.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/et-code"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not shutil.which("arm-none-eabi-g++"):
        sys.exit("error: arm-none-eabi-g++ not found (apt-get install -y gcc-arm-none-eabi)")
    commit = run(["git", "--git-dir", str(args.executorch), "rev-parse", args.commit]).strip()
    checkout(args.executorch, commit, args.work / "src")
    op_sets = {}
    for r in json.loads(args.memory.read_text()):
        op_sets.setdefault(tuple(sorted(set(r["cpu_ops"]))), []).append(r["model"])
    compiler = run(["arm-none-eabi-g++", "--version"]).splitlines()[0]
    rows = []
    for ops, models in sorted(op_sets.items()):
        unknown = [o for o in ops if o not in KERNELS]
        if unknown:
            sys.exit(f"error: no kernel sources known for CPU op {unknown[0]}")
        row = {"cpu_ops": list(ops), "models": sorted(set(models))}
        for variant, extra in LOGGING.items():
            objs = compile_all(args.work / "src", args.work / variant, extra)
            used = [objs[s] for o in ops for s in KERNELS[o].sources]
            entries = [entry_symbol(used, KERNELS[o].entry) for o in ops]
            tag = "+".join(sorted(KERNELS[o].entry for o in ops))
            size, undefined = link(used, entries, args.work / variant / f"{tag}.o")
            row[variant] = {**asdict(size), "flash": size.flash,
                            "toolchain_bytes": toolchain_bytes(used, entries, args.work / variant / f"{tag}.elf", size),
                            "runtime_and_toolchain_symbols_left": undefined}
        rows.append(row)
        print(f"{', '.join(row['models'])}: {', '.join(ops)}: flash {row['logging_on']['flash']} B with logging, "
              f"{row['logging_off']['flash']} B without (+ {row['logging_off']['toolchain_bytes']} B libgcc/newlib)")
    result = {"executorch_commit": commit, "compiler": compiler, "flags": FLAGS,
              "logging": LOGGING, "counted_by_size_mode": "logging_off", "sets": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
