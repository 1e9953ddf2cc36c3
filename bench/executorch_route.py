"""The second route users take today: a torch module -> ExecuTorch 1.5.1's Arm backend (PT2E int8) -> TOSA -> Vela.

A benchmark script, not part of npubuild. Run it with the Python of a scratch venv (bench/routes.py does):

    python3.11 -m venv /tmp/et-venv
    /tmp/et-venv/bin/pip install torch==2.13.0 'executorch[ethos-u]==1.5.1' onnx onnxruntime
    # the CPU build of torch (torch==2.13.0+cpu: the index https://download.pytorch.org/whl/cpu, or a local
    # wheel of it), else pip pulls CUDA's; bench/routes.md was last rendered with /work/peervenv/et: torch
    # 2.13.0+cpu, executorch 1.5.1, torchao 0.18.0, ExecuTorch's own ethos-u-vela 5.1.0
    PYTHONPATH=. /tmp/et-venv/bin/python bench/executorch_route.py --report /tmp/npb/report.json --json et.json

For every build in npubuild's report it takes the torch module the example's ONNX file was exported from
(npubuild.models.torch_zoo for the *_torch examples, the very same seeded modules; bench/onnx_as_torch.py, the
same weights, for the examples npubuild builds itself), quantises it with the Ethos-U quantizer of that target
(symmetric int8, per-channel weights; calibrated on the samples npubuild calibrates on: uniform [-1, 1], 32,
seed 0), lowers it with the EthosUPartitioner (ExecuTorch's own Vela 5.1 runs inside, as for its users) and
compiles the TOSA it hands Vela again with npubuild's Vela 5.2, options and Vela's named system config
(bench/peer_vela.py). Each row is one JSON object: the Vela figures, CPU ops (edge-graph ops outside the
delegates, not counting the quantize/dequantize at the graph's own inputs and outputs, `io_qdq`), compile_s
(export + quantize + lower, ExecuTorch's Vela included, + Vela 5.2) and quant_snr_db (the quantised module,
simulated by torch, against the float module on npubuild's verify inputs).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
import traceback
import warnings
from pathlib import Path
from unittest import mock

# ExecuTorch's Arm backend imported before any torch.export runs: imported after one (torch 2.13, sympy 1.14),
# torch._inductor.sizevars fails with "module 'sympy.logic' has no attribute 'boolalg'" on every model
import executorch.backends.arm.ethosu  # noqa: F401
import executorch.exir  # noqa: F401
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_as_torch import torch_module  # noqa: E402
from peer_vela import combine, named_config, vela, vela_options, vela_stage_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QDQ = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel")


class _Captured(Exception):
    """Raised by the stand-in for torch_zoo._export: carries the module and example it was handed."""


def zoo_module(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The seeded module (and example input) torch_zoo exports to configs/models/NAME.onnx.

    torch_zoo builds each module inside the function that exports it; replacing its exporter for the call
    hands back the module itself, so the ONNX file npubuild compiles and this module are the same network.
    """
    from npubuild.models import torch_zoo

    def capture(model, example, dynamo):
        raise _Captured(model, example)

    with mock.patch.object(torch_zoo, "_export", capture):
        try:
            torch_zoo.TORCH_MODELS[name]()
        except _Captured as got:
            model, example = got.args
            return model.eval(), example
    raise RuntimeError(f"torch_zoo.{name} exported nothing")


def example_module(name: str, models: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    from npubuild.models.torch_zoo import TORCH_MODELS

    return zoo_module(name) if name in TORCH_MODELS else torch_module(str(models / f"{name}.onnx"))


def snr_db(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    sig = sum(float((r.double() ** 2).sum()) for r in ref)
    noise = sum(float(((r.double() - g.double()) ** 2).sum()) for r, g in zip(ref, got, strict=True))
    return 10 * float(np.log10(sig / max(noise, 1e-30)))


def cpu_ops(edge) -> tuple[list[str], int, int]:
    """(ops outside the delegates, quantize/dequantize at the graph's I/O, delegate calls) of the edge program."""
    graph = edge.exported_program().graph_module.graph
    outside: list[str] = []
    io_qdq, delegates = 0, 0
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        name = str(n.target)
        if "executorch_call_delegate" in name:
            delegates += 1
        elif "getitem" in name:
            continue
        elif any(q in name for q in QDQ) and (all(a.op == "placeholder" for a in n.all_input_nodes)
                                              or all(u.op == "output" for u in n.users)):
            io_qdq += 1
        else:
            m = re.search(r"EdgeOpOverload: ([^>]+)>", name)
            outside.append(m.group(1) if m else name)
    return outside, io_qdq, delegates


def lower(module: torch.nn.Module, example: torch.Tensor, accelerator: str, work: Path) -> dict:
    """ExecuTorch's Ethos-U flow for one target; returns its TOSA files, the quantised module and timings."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*.tosa"):
        old.unlink()
    system, mode = named_config(accelerator)  # Vela's named config, as ExecuTorch's users get it
    spec = EthosUCompileSpec(accelerator, system_config=system, memory_mode=mode)
    spec.dump_intermediate_artifacts_to(str(work))
    calib = np.random.default_rng(0).uniform(-1, 1, size=(32, *example.shape)).astype(np.float32)
    start = time.perf_counter()
    exported = torch.export.export(module, (example,))
    quantizer = EthosUQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(exported.module(check_guards=False), quantizer)
    for x in calib:
        prepared(torch.from_numpy(x))
    quantized = convert_pt2e(prepared)
    edge = to_edge_transform_and_lower(torch.export.export(quantized, (example,)),
                                       partitioner=[EthosUPartitioner(spec)],
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    seconds = time.perf_counter() - start
    outside, io_qdq, delegates = cpu_ops(edge)
    tosa = sorted(work.glob("output_tag*.tosa"))
    if not tosa:
        raise RuntimeError("ExecuTorch delegated nothing to the NPU")
    return {"tosa": tosa, "quantized": quantized, "lower_s": seconds, "cpu_ops": outside, "io_qdq": io_qdq,
            "delegates": delegates, "edge": edge}


def quant_snr(module: torch.nn.Module, quantized, example: torch.Tensor, n: int = 8, seed: int = 1) -> float:
    """The quantised module against the float one, on npubuild's verify inputs (seed + 1000003, 8 samples)."""
    batch = np.random.default_rng(seed + 1_000_003).uniform(-1, 1, size=(n, *example.shape)).astype(np.float32)
    with torch.no_grad():
        ref = [module(torch.from_numpy(x)) for x in batch]
        got = [quantized(torch.from_numpy(x)) for x in batch]
    return snr_db(ref, got)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, required=True, help="npubuild's report.json (its builds and options)")
    ap.add_argument("--models", type=Path, default=ROOT / "configs" / "models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/executorch-route"))
    ap.add_argument("--json", type=Path, required=True, help="write the rows here")
    ap.add_argument("--only", nargs="*", help="model names")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    report = json.loads(args.report.read_text())
    rows = []
    modules: dict[str, tuple] = {}
    for e in report["builds"]:
        model, target = e["model"], e["target"]
        acc = e.get("accelerator") or target
        if args.only and model not in args.only:
            continue
        row = {"model": model, "target": target, "route": "executorch"}
        try:
            if model not in modules:
                modules[model] = example_module(model, args.models)
            module, example = modules[model]
            work = args.work / model / target
            got = lower(module, example, acc, work / "et")
            stage = vela_stage_dir(e, args.report.parent)
            parts = [vela(t, acc, vela_options(stage / "stage.json"), work / f"vela-{i}") for i, t in
                     enumerate(got["tosa"])]
            row.update(combine(parts))
            row.update({"cpu_ops": row["cpu_ops"] + len(got["cpu_ops"]), "cpu_op_names": got["cpu_ops"],
                        "io_qdq": got["io_qdq"],
                        "npu_partitions": got["delegates"], "lower_s": round(got["lower_s"], 3),
                        "compile_s": round(got["lower_s"] + row["vela_s"], 3),
                        "quant_snr_db": quant_snr(module, got["quantized"], example),
                        "tosa": [str(t) for t in got["tosa"]]})
        except Exception as exc:  # the route's failure goes into the table; keep going
            row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ''}"
            (args.work / f"{model}-{target}.error.txt").parent.mkdir(parents=True, exist_ok=True)
            (args.work / f"{model}-{target}.error.txt").write_text(traceback.format_exc())
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tosa"}), flush=True)
    if args.only and args.json.exists():  # a partial rerun replaces those models' rows only
        rows = [r for r in json.loads(args.json.read_text()) if r["model"] not in args.only] + rows
    args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
