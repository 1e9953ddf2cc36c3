"""`npubuild simulate`: run a compiled Vela artifact on npu-sim (outputs and a per-op listing), or a build's
deployable .tflite on the virtual device (TensorFlow Lite Micro for the host operators, npu-sim for the NPU)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from npubuild.errors import InputError

if TYPE_CHECKING:
    from npubuild.records.iospec import IOSpec
    from npubuild.records.lower import LowerRecord


def _load_input(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read input: {exc}", path) from None


def _same_io(io: LowerRecord, model) -> bool:
    sizes = [[s.size for s in specs] for specs in (io.inputs, io.outputs)]
    return sizes == [[int(np.prod(p.shape)) for p in places] for places in (model.inputs, model.outputs)]


def _tosa_names(art, model, feeds: list[np.ndarray], ops) -> list[str | None]:
    """Each op's TOSA tensor (when the build's graph is known): names Vela's per-layer rows use."""
    from npubuild.npusim.tosa_probe import intermediates
    from npubuild.npusim.verify import tensor_of

    if art.tosa is None or art.io is None or not art.tosa.is_file():
        return [None] * len(ops)
    xs = [np.asarray(x).reshape(spec.shape).astype(spec.dtype) for x, spec in zip(feeds, art.io.inputs, strict=True)]
    inter = intermediates(art.tosa.read_bytes(), xs)
    return [tensor_of(op, inter) for op in ops]


def _deployable_of(build_dir: Path, select: str | None) -> tuple[Path, str, dict] | None:
    """(its .tflite, label, vela summary) when the selected build deploys host partitions beside the NPU ones."""
    import json

    report = build_dir / "report.json"
    if not report.is_file():
        return None
    found = []
    for b in json.loads(report.read_text()).get("builds", []):
        label = f"{b['spec']}/{b['model']}/{b['target']}"
        if select and select not in (label, b["target"], f"{b['model']}/{b['target']}"):
            continue
        graph = (b.get("metrics") or {}).get("partition_graph") or []
        vela = (b.get("artifacts") or {}).get("vela")
        if vela and any(p["kind"] == "host" for p in graph):
            found.append((Path(vela).parent, label))
    if len(found) != 1:
        return None
    stage, label = found[0]
    summary = json.loads((stage / "summary.json").read_text())
    deployable = summary.get("deployable")
    return (stage / deployable["tflite"], label, summary) if deployable else None


def simulate_device(tflite: Path, label: str, summary: dict | None, args) -> int:
    """The whole deployable on the virtual device: host operators in TensorFlow Lite Micro, ethos-u in npu-sim."""
    from npubuild.deploy.virtual_device import HostRun, VirtualDevice
    from npubuild.npusim.artifact import prepare_input
    from npubuild.records.iospec import specs_from_json

    device = VirtualDevice(tflite.read_bytes(), str(tflite))
    deployable = (summary or {}).get("deployable") or {}
    ins = specs_from_json(deployable["inputs"]) if deployable else [None] * len(device.graph_inputs)
    outs = specs_from_json(deployable["outputs"]) if deployable else [None] * len(device.graph_outputs)
    if args.input and len(args.input) != len(device.graph_inputs):
        raise InputError(f"the deployable has {len(device.graph_inputs)} inputs, got {len(args.input)} --input")
    feeds = []
    for i, t in enumerate(device.graph_inputs):
        shape, dtype = device.shapes[t], np.dtype(device.dtypes[t])
        if args.input:
            feeds.append(prepare_input(_load_input(args.input[i]), shape, ins[i], args.input[i]))
        else:
            info = np.iinfo(dtype)
            feeds.append(np.random.default_rng(args.seed + i).integers(info.min, info.max + 1, shape).astype(dtype))
    t0 = time.perf_counter()
    ys = device.run(feeds)
    seconds = time.perf_counter() - t0
    print(f"{label}: the deployable on the virtual device, run in {seconds:.3f} s"
          + ("" if args.input else f" (random input, seed {args.seed})"))
    for step in device.steps:
        if isinstance(step, HostRun):
            print(f"  TFLite Micro: operators {step.ops[0]}..{step.ops[-1]}, arena {step.arena_bytes} bytes")
        else:
            print(f"  Ethos-U (npu-sim): operator {step.op_index}, {step.model.accelerator}")
    for i, (y, spec) in enumerate(zip(ys, outs, strict=True)):
        name = spec.onnx_name if spec else f"output {i}"
        if spec:
            y = spec.from_tosa(np.asarray(y).reshape(spec.shape))
        print(f"{name}: shape {list(y.shape)} {y.dtype}")
        print(np.array2string(y.reshape(-1)[:64], max_line_width=100))
        if spec and spec.quantized:
            print("dequantized:", np.array2string(spec.dequantize(y).reshape(-1)[:64], precision=4, max_line_width=100))
        if args.save:
            out = Path(args.save) / f"output{i}.npy"
            out.parent.mkdir(parents=True, exist_ok=True)
            np.save(out, y)
    return 0


def cmd_simulate(args) -> int:
    from npubuild.npusim.artifact import layer_cycles, load_artifact, locate, prepare_input
    from npubuild.npusim.sim import run

    path = Path(args.artifact)
    if path.is_file() and path.suffix == ".tflite":
        return simulate_device(path, path.name, None, args)
    if path.is_dir():
        device = _deployable_of(path, args.build)
        if device is not None:
            return simulate_device(*device, args)
    art = locate(args.artifact, args.build)
    model = load_artifact(art.path)
    if art.io and not _same_io(art.io, model):
        art.io, art.tosa = None, None  # one NPU partition of a split graph: its I/O is not the model's
    if args.input and len(args.input) != len(model.inputs):
        raise InputError(f"the artifact has {len(model.inputs)} inputs, got {len(args.input)} --input")
    io_inputs: Sequence[IOSpec | None] = art.io.inputs if art.io else [None] * len(model.inputs)
    feeds = []
    for i, place in enumerate(model.inputs):
        if args.input:
            feeds.append(prepare_input(_load_input(args.input[i]), place.shape, io_inputs[i], args.input[i]))
        else:
            info = np.iinfo({1: np.int8, 2: np.int16, 4: np.int32}[place.elem_size])
            rng = np.random.default_rng(args.seed + i)
            feeds.append(rng.integers(info.min, info.max + 1, place.shape))
    t0 = time.perf_counter()
    result = run(model, feeds)
    seconds = time.perf_counter() - t0
    print(f"{art.label}: {model.accelerator}, {len(result.ops)} NPU ops, simulated in {seconds:.3f} s"
          + ("" if args.input else f" (random input, seed {args.seed})"))
    tensors, cycles = _tosa_names(art, model, feeds, result.ops), layer_cycles(art.path)
    print(f"{'#':>4}  {'op':<18} {'ifm':<14} {'ifm fmt':<8} {'ofm':<14} {'ofm fmt':<8} {'tosa':<12} "
          f"{'cycles':>8}  detail")
    for n, op in enumerate(result.ops):
        name = tensors[n] or "-"
        cyc = cycles.get(name, "") if tensors[n] else ""
        print(f"{n:>4}  {op.kind:<18} {str(list(op.ifm_shape)):<14} {op.ifm_format:<8} "
              f"{str(list(op.ofm_shape)):<14} {op.ofm_format:<8} {name:<12} {cyc!s:>8}  {op.detail}")
    io_outputs: Sequence[IOSpec | None] = art.io.outputs if art.io else [None] * len(result.outputs)
    for i, (y, spec) in enumerate(zip(result.outputs, io_outputs, strict=True)):
        name = spec.onnx_name if spec else f"output {i}"
        if spec and y.size == spec.size:
            y = spec.from_tosa(y.reshape(spec.shape))
        print(f"{name}: shape {list(y.shape)} {y.dtype}")
        print(np.array2string(y.reshape(-1) if y.size <= 64 else y.reshape(-1)[:64], max_line_width=100))
        if spec and spec.quantized:
            deq = spec.dequantize(y)
            print("dequantized:", np.array2string(deq.reshape(-1)[:64], precision=4, max_line_width=100))
        if args.save:
            out = Path(args.save) / f"output{i}.npy"
            out.parent.mkdir(parents=True, exist_ok=True)
            np.save(out, y)
    return 0


def register(sub) -> None:
    s = sub.add_parser("simulate", help="run a compiled Vela artifact on npu-sim, the NPU functional model, "
                       "or a deployable .tflite on the virtual device (TFLite Micro + npu-sim)")
    s.add_argument("artifact", metavar="BUILD_OR_NPZ", help="a *_vela.npz, a vela stage directory, a .tflite (run on "
                   "the virtual device), or a build directory (a build with host partitions runs its whole "
                   "deployable; a whole-graph build lists npu-sim's ops)")
    s.add_argument("--input", action="append", metavar="NPY", help="input .npy (repeat per input): integers in the artifact's "
                   "NHWC shape, or floats in ONNX layout when a build directory gives the quantisation")
    s.add_argument("--build", metavar="ID", help="spec/model/target (or target) when the build directory has several "
                   "builds (default: its only one)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random input used without --input")
    s.add_argument("--save", metavar="DIR", help="directory to write output<i>.npy (default: not saved)")
    s.set_defaults(func=cmd_simulate)
