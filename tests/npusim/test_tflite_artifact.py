"""npu-sim reads Vela's .tflite: the ethos-u operator's command stream, constants and I/O placement are those of
the raw .npz of the same compile, and running it is bit-exact against the TOSA reference model, with the
arena cache (U65/U85 Dedicated_Sram: a fast scratch of its own) and without (U55 Shared_Sram). The raw .npz the
vela stage writes from the .tflite (one Vela run where it used to run two) is Vela's own, array for array."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import lower_int, mean_then_channel_mul, reference, tosa_inputs
from npbtest.ops import ROOT

from npubuild.config.load import default_search_path, load_target
from npubuild.errors import InputError
from npubuild.ethosu.artifact import VelaArtifact
from npubuild.ethosu.vela import vela_command
from npubuild.ethosu.vela_ini import render_ini
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run
from npubuild.npusim.tflite import load_tflite


def _compile(tosa: bytes, target: str, tmp: Path, output_format: str) -> Path:
    profile, _ = load_target(target, default_search_path(ROOT), None)
    src, ini, out = tmp / "m.tosa", tmp / "system.ini", tmp / output_format
    src.write_bytes(tosa)
    ini.write_text(render_ini(profile))
    proc = subprocess.run(vela_command(src, ini, out, profile, profile.vela, output_format),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(out.glob("m_vela.*"))


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_the_tflite_holds_the_raw_artifact_and_runs_bit_exact(target, tmp_path):
    tosa, io = lower_int(mean_then_channel_mul(), [1, 16, 64])
    raw = load_raw(_compile(tosa, target, tmp_path, "raw"))
    (deployed,) = load_tflite(_compile(tosa, target, tmp_path, "tflite"))
    assert deployed.accelerator == raw.accelerator == target
    assert np.array_equal(deployed.commands, raw.commands)
    assert deployed.weights == raw.weights
    assert (deployed.scratch_size, deployed.fast_size) == (raw.scratch_size, raw.fast_size)
    assert [(p.shape[-1], p.region, p.offset) for p in deployed.inputs + deployed.outputs] == \
           [(p.shape[-1], p.region, p.offset) for p in raw.inputs + raw.outputs]
    if target != "ethos-u55-128":
        assert deployed.fast_size > 0  # the arena cache is a tensor of its own, region 2
    vela_npz = next((tmp_path / "raw").glob("m_vela.npz"))
    ours = tmp_path / "ours.npz"
    VelaArtifact.from_tflite(next((tmp_path / "tflite").glob("m_vela.tflite"))).write_npz(ours)
    with np.load(vela_npz, allow_pickle=True) as want, np.load(ours, allow_pickle=True) as got:
        assert sorted(got.files) == sorted(want.files)
        for key in want.files:
            if key.endswith("_quantization"):
                assert [e["quant_type"] for e in got[key]] == [e["quant_type"] for e in want[key]], key
            else:
                assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    for seed in (0, 1):
        xs = tosa_inputs(io, seed)
        want = reference(tosa, xs)[0]
        assert np.array_equal(run(deployed, xs).outputs[0].reshape(want.shape), want)


def test_a_file_that_is_not_a_flatbuffer_is_one_line():
    with tempfile.NamedTemporaryFile(suffix=".tflite") as f:
        f.write(b"not a model at all")
        f.flush()
        with pytest.raises(InputError, match="not a TFLite flatbuffer"):
            load_tflite(f.name)
