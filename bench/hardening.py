"""What the hardening of issue 16 costs and why one limit exists: `python bench/hardening.py`.

Prints one Markdown table:
- onnxruntime's static quantiser on Relu chains of N nodes (npubuild's quantize(), minmax, 8 samples): the
  time grows with N squared, and cProfile names where (onnxruntime's calibrate.augment_graph and
  base_quantizer.adjust_tensor_ranges rebuild whole-graph maps once per tensor / per node), which is why
  frontend/quantize.py refuses models past MAX_QUANTIZE_NODES instead of sitting in quantize for minutes;
- the import stage in a forked child (engine/isolate.py) against in-process, on the kws DS-CNN;
- how long a model too big for its only target takes to fail (the early pool check at import).

`--issue34 [--tree DIR] [--huge-n]`: issue 34's cases instead (bench/hardening_issue34.py): stale results,
-n past the machine, planted cache files, streamed entries, full disks, input faults, debris.
"""

from __future__ import annotations

import cProfile
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from npubuild.engine.execute import stage_modules
from npubuild.engine.isolate import run_isolated
from npubuild.frontend.data import random_arrays
from npubuild.frontend.normalise import import_model
from npubuild.frontend.quantize import quantize
from npubuild.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
CHAIN_SIZES = (250, 500, 1000, 2000)


def relu_chain(n: int) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [prev], [out], name=f"relu{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def quantize_chain(tmp: Path, n: int) -> tuple[float, float]:
    """(seconds, share of them in onnxruntime's two whole-graph loops) for one chain."""
    path = tmp / f"chain{n}.onnx"
    model = onnx.shape_inference.infer_shapes(relu_chain(n))
    onnx.save(model, path)
    arrays = random_arrays(model, 8, 0, -1.0, 1.0)
    q = {"per_channel": True, "method": "minmax", "symmetric_activations": False}
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(quantize, path, arrays, q)
    seconds = time.perf_counter() - start
    stats = pstats.Stats(prof)
    loops = sum(v[3] for k, v in stats.stats.items() if k[2] in ("augment_graph", "adjust_tensor_ranges"))
    return seconds, loops / seconds


def import_overhead(tmp: Path, repeats: int = 5) -> tuple[float, float]:
    src = REPO / "configs" / "models" / "ds_cnn.onnx"
    shapes = {"input": [1, 1, 49, 10]}
    import_model(src, shapes, tmp / "warm.onnx")  # imports and caches paid once
    inproc, forked = [], []
    for i in range(repeats):
        t = time.perf_counter()
        import_model(src, shapes, tmp / f"a{i}.onnx")
        inproc.append(time.perf_counter() - t)
        t = time.perf_counter()
        run_isolated(import_model, src, shapes, tmp / f"b{i}.onnx", what="import", where=str(src))
        forked.append(time.perf_counter() - t)
    return min(inproc), min(forked)


def served_overhead(tmp: Path, repeats: int = 5) -> tuple[float, float]:
    """The import from a non-main thread (as on a Dask worker): its child comes from the forkserver. The first
    call starts the server and preloads the stage modules; later calls only fork it."""
    src = REPO / "configs" / "models" / "ds_cnn.onnx"
    shapes = {"input": [1, 1, 49, 10]}
    times: list[float] = []

    def calls() -> None:
        for i in range(repeats + 1):
            t = time.perf_counter()
            run_isolated(import_model, src, shapes, tmp / f"s{i}.onnx", what="import", where=str(src),
                         preload=stage_modules(STAGES))
            times.append(time.perf_counter() - t)

    thread = threading.Thread(target=calls)
    thread.start()
    thread.join()
    return times[0], min(times[1:])


def early_failure_seconds(tmp: Path) -> tuple[float, str]:
    """A 1x16x512x512 conv (4 MiB in, 4 MiB out) for a 2 MiB-SRAM Ethos-U55 only: seconds to the pool line."""
    import numpy as np
    from onnx import numpy_helper

    w = np.random.default_rng(0).uniform(-0.5, 0.5, (16, 16, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp / "big.onnx")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "npubuild", "compile", str(tmp / "big.onnx"), "--target",
                           "ethos-u55-128", "--build-dir", str(tmp / "b"), "--json"], capture_output=True, text=True)
    return time.perf_counter() - start, proc.stderr.strip().splitlines()[-1]


def main() -> int:
    if "--issue34" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from hardening_issue34 import main as issue34

        return issue34(sys.argv[1:])
    rows: list[tuple[str, str]] = []
    only_isolation = sys.argv[1:] == ["--isolation"]  # the fork rows alone (seconds, not the quantiser's minutes)
    with tempfile.TemporaryDirectory(prefix="npubuild-hardening-") as d:
        tmp = Path(d)
        per_n2 = 0.0
        for n in [] if only_isolation else CHAIN_SIZES:
            seconds, share = quantize_chain(tmp, n)
            per_n2 = seconds / n**2  # the largest chain's coefficient: it grows with N
            rows.append((f"quantize, Relu chain of {n}", f"{seconds:.1f} s ({seconds / n**2 * 1e6:.1f} us x N^2; "
                                                         f"{share:.0%} in augment_graph + adjust_tensor_ranges)"))
        if not only_isolation:
            rows.append(("  extrapolated to 10,000 nodes", f"{per_n2 * 1e8 / 60:.0f} min"))
        inproc, forked = import_overhead(tmp)
        rows.append(("import of ds_cnn, in process / in a forked child (best of 5)",
                     f"{inproc * 1000:.0f} ms / {forked * 1000:.0f} ms"))
        first, served = served_overhead(tmp)
        rows.append(("import of ds_cnn from a thread, forkserver child: first call (starts the server) / best of 5",
                     f"{first * 1000:.0f} ms / {served * 1000:.0f} ms"))
        if not only_isolation:
            seconds, line = early_failure_seconds(tmp)
            rows.append(("4 MiB in + out conv on a 2 MiB SRAM: time to the pool line (CLI, incl. start-up)",
                         f"{seconds:.1f} s: `{line}`"))
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
