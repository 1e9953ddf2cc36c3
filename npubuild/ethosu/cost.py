"""Vela's own estimate of what a QDQ model costs on a target, per ONNX node: what the precision search weighs.

The model goes the way a build takes it (the pipeline's passes, the lowering and partitioning of the target's
family, Vela with the .ini written from the target profile) into a scratch directory, and Vela's per-layer
cycles are charged to the ONNX nodes they came from (perf.parse_per_layer). A pool that does not fit is
recorded, not raised: the search needs the figures of a plan that does not fit to know to leave it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import TargetProfile, VelaOptions
from npubuild.errors import StageError


@dataclass(frozen=True)
class Cost:
    """One QDQ model compiled for one target."""

    target: str
    npu_cycles: int
    inference_ms: float
    sram_kib: float
    offchip_kib: float
    constants_bytes: int
    fits: bool
    node_cycles: dict[str, int] = field(default_factory=dict)  # ONNX node -> Vela cycles of its layers

    def to_json(self) -> dict:
        return {"target": self.target, "npu_cycles": self.npu_cycles, "inference_ms": self.inference_ms,
                "sram_kib": self.sram_kib, "offchip_kib": self.offchip_kib,
                "constants_bytes": self.constants_bytes, "fits": self.fits}


def vela_cost(qdq: onnx.ModelProto, passes: Sequence[str], profile: TargetProfile, opts: VelaOptions,
              scratch: Path | None = None) -> Cost:
    """Lower `qdq` for the target's family and compile it with Vela; Vela's figures and cycles per ONNX node.
    `scratch`: where to work; a stage dir of a build dir (the precision stage's) brings that build dir's Vela
    cache (ethosu/vela_cache.py): the measured choices' compiles then give the compile of the graph chosen, and
    the lower and vela stages of the candidate the search keeps restore what the search compiled."""
    from npubuild.ethosu.families import lower_families
    from npubuild.ethosu.vela import compile_model
    from npubuild.ethosu.vela_cache import for_stage_dir
    from npubuild.frontend.passes import run_passes

    family = Accelerator.parse(profile.accelerator).lowering_family
    model = ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(qdq), list(passes)))
    cache = for_stage_dir(scratch) if scratch is not None else None
    with tempfile.TemporaryDirectory(prefix="npubuild-cost-", dir=scratch) as tmp:
        work = Path(tmp)
        io, _ = lower_families(model, "int", work, (family,), vela_cache=cache)
        io.write(work / "io.json")
        out = work / "vela"
        out.mkdir()
        fits = True
        try:
            metrics = compile_model(work / "io.json", profile, opts, out, out / "system.ini", out / "summary.json",
                                    cache)
        except StageError:
            summary = out / "summary.json"
            if not summary.is_file():
                raise
            metrics, fits = json.loads(summary.read_text()), False
    node_cycles: dict[str, int] = {}
    for layer in metrics.get("layers", []):
        node = layer.get("onnx_node")
        if node:
            node_cycles[node] = node_cycles.get(node, 0) + int(layer.get("cycles") or 0)
    return Cost(profile.name, int(metrics["npu_cycles"]), float(metrics["inference_ms"]), float(metrics["sram_kib"]),
                float(metrics["offchip_kib"]), int(metrics["memory"]["constants_bytes"]), fits, node_cycles)
