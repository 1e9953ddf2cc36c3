"""npubuild's .ini models each accelerator exactly as Vela's own bundled config for it does.

Every shipped profile that declares `mirrors:` (a system config and memory mode of Vela's bundled
vela.ini) is compiled twice on the same TOSA graph: through the .ini npubuild writes, and through
Vela's vela.ini with the named config. Cycles, inference time, SRAM and off-chip use must be
identical. The graph streams a 256 KiB fully connected weight matrix from the constants' memory, so a
wrong bus width (Vela 5.2 takes the U55's from the section name) changes the figures.
"""

from __future__ import annotations

import csv
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import ethosu.vela
import numpy as np
import pytest
from npbtest.ops import quantize_model
from onnx import TensorProto, helper, numpy_helper

from npubuild.config.load import default_search_path, load_target
from npubuild.config.schema import ACCELERATORS, TargetProfile
from npubuild.ethosu.vela import vela_command
from npubuild.ethosu.vela_ini import arena_cache_bytes, render_ini
from npubuild.lowering.driver import lower_model

ROOT = Path(__file__).resolve().parents[2]
BUNDLED_INI = Path(ethosu.vela.__file__).parents[1] / "config_files" / "Arm" / "vela.ini"
FIGURES = ("cycles_total", "inference_time", "sram_memory_used", "off_chip_flash_memory_used", "dram_memory_used")


@cache
def conv_and_streamed_fc() -> bytes:
    """A 3x3 conv then a 2048 -> 128 FC (256 KiB of int8 weights, read once: bandwidth-bound)."""
    rng = np.random.default_rng(7)
    w_conv = rng.normal(0, 0.2, (32, 8, 3, 3)).astype(np.float32)
    w_fc = rng.normal(0, 0.05, (2048, 128)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w_conv"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w_fc"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "streamed_fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])],
                              [numpy_helper.from_array(w_conv, "w_conv"), numpy_helper.from_array(w_fc, "w_fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calib = {"x": rng.uniform(-1, 1, (8, 1, 8, 8, 8)).astype(np.float32)}
    return lower_model(quantize_model(model, calib), "int").tosa


def vela_figures(tosa: bytes, profile: TargetProfile, ini_text: str | None, system_config: str,
                 memory_mode: str) -> dict[str, float]:
    """Vela's summary figures for `tosa`, with npubuild's options and the given .ini (None: Vela's bundled one)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "m.tosa", Path(tmp) / "out"
        src.write_bytes(tosa)
        ini = BUNDLED_INI
        if ini_text is not None:
            ini = Path(tmp) / "system.ini"
            ini.write_text(ini_text)
        cmd = vela_command(src, ini, out, profile, profile.vela)
        cmd[cmd.index("--system-config") + 1] = system_config
        cmd[cmd.index("--memory-mode") + 1] = memory_mode
        if ini_text is None:  # a memory mode without a size of its own: the profile's (npubuild always writes one)
            cmd += ["--arena-cache-size", str(arena_cache_bytes(profile))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with next(out.glob("*_summary_*.csv")).open(newline="") as f:
            row = next(csv.DictReader(f))
    return {k: float(row[k]) for k in FIGURES}


def shipped(name: str) -> TargetProfile:
    return load_target(name, default_search_path(ROOT), None)[0]


def test_every_shipped_profile_says_which_bundled_config_it_mirrors():
    bundled = BUNDLED_INI.read_text()
    for name in ACCELERATORS:
        m = shipped(name).mirrors
        assert m is not None, name
        assert f"[System_Config.{m.system_config}]" in bundled and f"[Memory_Mode.{m.memory_mode}]" in bundled


@pytest.mark.parametrize("name", ACCELERATORS)
def test_npubuild_ini_gives_vela_figures_identical_to_its_bundled_config(name: str):
    profile = shipped(name)
    ini_text = render_ini(profile)
    ours = vela_figures(conv_and_streamed_fc(), profile, ini_text, _section(ini_text, "System_Config"),
                        _section(ini_text, "Memory_Mode"))
    theirs = vela_figures(conv_and_streamed_fc(), profile, None, profile.mirrors.system_config,
                          profile.mirrors.memory_mode)
    assert ours == theirs


def test_a_neutral_section_name_would_give_a_u55_the_wide_bus():
    """The check above can fail: the same values under a name Vela does not take for a U55 run faster."""
    profile = shipped("ethos-u55-128")
    ini_text = render_ini(profile)
    ours = _section(ini_text, "System_Config")
    neutral = ini_text.replace(f"[System_Config.{ours}]", "[System_Config.npubuild_system]")
    fast = vela_figures(conv_and_streamed_fc(), profile, neutral, "npubuild_system", "npubuild_memory")
    right = vela_figures(conv_and_streamed_fc(), profile, ini_text, ours, "npubuild_memory")
    assert fast["cycles_total"] < 0.8 * right["cycles_total"]


def _section(ini_text: str, kind: str) -> str:
    return next(ln[len(kind) + 2:-1] for ln in ini_text.splitlines() if ln.startswith(f"[{kind}."))
