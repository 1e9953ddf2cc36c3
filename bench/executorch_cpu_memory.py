"""What the ExecuTorch route's CPU part holds beyond Vela's figures, measured by ExecuTorch's own memory planner.

    PYTHONPATH=. /work/scratch/venvs/et/bin/python bench/executorch_cpu_memory.py --routes bench/routes.md \\
        --out bench/executorch_cpu_memory.json

A benchmark script, not part of npubuild; run with the ExecuTorch venv of bench/executorch_route.py. Where the
route leaves ops on the CPU (the U-Nets' bilinear upsample and ResNet-8's average pool on U55 / U65), its program
is Vela delegates with CPU ops between them, and bench/routes.md's figures are the delegates' Vela figures only
(peer_vela.combine: the largest scratch, the constants summed). ExecuTorch's Ethos-U backend allocates a
delegate's scratch from the temp allocator for the call and copies the delegate's inputs into it and its outputs
out of it (backends/arm/runtime/EthosUBackend.cpp: "Write argument values (from EValue tensor) into Ethos-U
scratch"), so every tensor handed to or from a CPU op, and the CPU op's own output (the upsample runs in float:
dequantize, upsample, quantize), lives in the program's planned memory beside the scratch. This script lowers
each such build as bench/executorch_route.py does and runs ExecuTorch's memory planning (to_executorch) with the
graph's own input and output left to the caller (MemoryPlanningPass(alloc_graph_input=False,
alloc_graph_output=False): a caller holds those for npubuild's firmware too, inside Vela's arena), and writes
the planned bytes per build, with the tensors outside the delegates listed. bench/size_mode.py adds them to the
route's SRAM where the route's named memory mode keeps the arena in SRAM (Shared_Sram: U55), else to its
off-chip figure (Dedicated_Sram: U65 / U85 keep the arena in DRAM).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from executorch_route import example_module, lower  # noqa: E402 (imports ExecuTorch first, as it must)
from peer_vela import named_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cpu_builds(routes_md: Path) -> list[tuple[str, str]]:
    """(model, target) of every routes.md row whose ExecuTorch route left ops on the CPU."""
    out = []
    for line in routes_md.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or not cells[1].startswith("ethos-"):
            continue
        et_cpu = cells[7].split("/")[-1].strip()
        if et_cpu not in ("-", "0") and et_cpu.isdigit():
            out.append((cells[0], cells[1]))
    return out


def planned_bytes(edge) -> tuple[int, list[dict]]:
    """ExecuTorch's planned activation bytes without the graph's own input and output, and the tensors it plans."""
    import torch
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    prog = edge.to_executorch(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)))
    sizes = prog.executorch_program.execution_plan[0].non_const_buffer_sizes
    tensors = []
    for n in prog.exported_program().graph_module.graph.nodes:
        spec = n.meta.get("spec")
        val = n.meta.get("val")
        if n.op != "call_function" or spec is None or not isinstance(val, torch.Tensor) or spec.mem_id is None:
            continue
        tensors.append({"node": n.name, "shape": list(val.shape), "dtype": str(val.dtype).replace("torch.", ""),
                        "bytes": int(val.numel() * val.element_size()), "offset": spec.mem_offset})
    return int(sum(sizes)), tensors


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routes", type=Path, default=ROOT / "bench" / "routes.md")
    ap.add_argument("--models", type=Path, default=ROOT / "configs" / "models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/executorch-cpu-memory"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    for model, target in cpu_builds(args.routes):
        module, example = example_module(model, args.models)
        got = lower(module, example, target, args.work / model / target)
        total, tensors = planned_bytes(got["edge"])
        mode = named_config(target)[1]
        rows.append({"model": model, "target": target, "cpu_ops": got["cpu_ops"], "planned_bytes": total,
                     "memory_mode": mode, "adds_to": "sram_kib" if mode == "Shared_Sram" else "offchip_kib",
                     "tensors": tensors})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "tensors"}), flush=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
