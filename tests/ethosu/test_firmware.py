"""Firmware-ready output: the generated C compiles with gcc -Wall -Werror and carries exactly what Vela produced (the
ethos-u operator of its .tflite, read here by npu-sim's reader, which tests/npusim/test_tflite_artifact.py holds to
Vela's own raw output)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from npbtest import REPO, read_report, run_cli

from npubuild.npusim.tflite import npu_operators


def _vela_operator(vela_dir: Path):
    """The ethos-u operator of the stage's Vela .tflite (in the stage dir, or in tflite/ beside raw output)."""
    (path,) = sorted(vela_dir.glob("*_vela.tflite")) or sorted(vela_dir.glob("tflite/*_vela.tflite"))
    (op,) = npu_operators(path.read_bytes(), str(path))
    return op

MAIN_C = """#include <stdio.h>
#include "{p}.h"
int main(int argc, char **argv) {{
    if (argc != 3) return 2;
    FILE *f = fopen(argv[1], "wb");
    fwrite({p}_command_stream, 1, {P}_COMMAND_STREAM_SIZE, f);
    fclose(f);
    f = fopen(argv[2], "wb");
    fwrite({p}_constants, 1, {P}_CONSTANTS_SIZE, f);
    fclose(f);
    printf("%u %u %u %u %s\\n", {P}_ARENA_SIZE, {P}_FAST_SCRATCH_SIZE, {P}_CONSTANTS_SIZE,
           {P}_COMMAND_STREAM_SIZE, {P}_MEMORY_MODE);
    for (unsigned i = 0; i < {P}_NUM_INPUTS; i++)
        printf("input %s %u %u %u %.9g %d\\n", {p}_inputs[i].name, {p}_inputs[i].region, {p}_inputs[i].offset,
               {p}_inputs[i].size, (double){p}_inputs[i].scale, (int){p}_inputs[i].zero_point);
    for (unsigned i = 0; i < {P}_NUM_OUTPUTS; i++)
        printf("output %s %u %u %u %.9g %d\\n", {p}_outputs[i].name, {p}_outputs[i].region, {p}_outputs[i].offset,
               {p}_outputs[i].size, (double){p}_outputs[i].scale, (int){p}_outputs[i].zero_point);
    return 0;
}}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs the host C compiler")
def test_generated_c_compiles_and_matches_the_compiled_artifact(tmp_path: Path, capsys):
    build_dir = tmp_path / "build"
    code, _, err = run_cli(["compile", str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target", "ethos-u55-128",
                            "--target", "ethos-u65-256", "--build-dir", str(build_dir), "--json"], capsys,
                           cwd=tmp_path)
    assert code == 0, err
    io = json.loads(next((build_dir / "stages" / "lower").glob("*/io.json")).read_text())
    modes = {}
    for b in read_report(build_dir / "compile")["builds"]:  # compile's own report, not the project's
        fw = b["metrics"]["firmware"]
        assert len(fw) == 1
        fw = fw[0]
        vela_dir = Path(b["artifacts"]["vela"]).parent
        header, source = vela_dir / fw["header"], vela_dir / fw["source"]
        manifest = json.loads((vela_dir / fw["manifest"]).read_text())
        prefix = fw["prefix"]
        work = tmp_path / b["target"]
        work.mkdir()
        (work / "main.c").write_text(MAIN_C.format(p=prefix, P=prefix.upper()))
        exe = work / "fw"
        proc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(header.parent),
                               str(source), str(work / "main.c"), "-o", str(exe)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        run = subprocess.run([str(exe), str(work / "cmd.bin"), str(work / "weights.bin")], capture_output=True,
                             text=True, check=True)
        lines = run.stdout.splitlines()
        arena, fast, const_size, cmd_size, mode = lines[0].split()
        op = _vela_operator(vela_dir)
        raw = op.model
        assert (work / "cmd.bin").read_bytes() == op.payload
        assert (work / "weights.bin").read_bytes() == raw.weights  # every byte, trailing zeros too
        assert int(arena) == raw.scratch_size == manifest["arena_size"]
        assert int(fast) == raw.fast_size == manifest["fast_scratch_size"]
        assert int(const_size) == len(raw.weights) and int(cmd_size) == len(op.payload)
        ins = [ln.split() for ln in lines if ln.startswith("input ")]
        outs = [ln.split() for ln in lines if ln.startswith("output ")]
        assert [int(r[3]) for r in ins] == [p.offset for p in raw.inputs]
        assert [int(r[2]) for r in ins] == [p.region for p in raw.inputs]
        assert [int(r[3]) for r in outs] == [p.offset for p in raw.outputs]
        assert [int(r[4]) for r in outs] == [p.nbytes for p in raw.outputs]
        for row, spec in zip(ins + outs, io["inputs"] + io["outputs"], strict=True):
            assert row[1] == spec["onnx_name"]
            assert float(row[5]) == pytest.approx(spec["scale"], rel=1e-6) and int(row[6]) == spec["zero_point"]
        modes[b["target"]] = (mode, manifest, int(fast), b["metrics"]["pools"])
    mode, manifest, fast, _ = modes["ethos-u55-128"]
    assert mode == "Shared_Sram" and fast == 0
    assert {r["role"]: r["pool"] for r in manifest["regions"]} == {"constants": "flash", "arena": "sram"}
    # U65: arena in DRAM, the fast scratch (arena cache) in the dedicated SRAM, each charged to its own pool
    mode, manifest, fast, pools = modes["ethos-u65-256"]
    assert mode == "Dedicated_Sram" and fast > 0
    roles = {r["role"]: r for r in manifest["regions"]}
    assert roles["fast_scratch"]["pool"] == "sram" and roles["arena"]["pool"] == "dram"
    by_pool = {p["pool"]: p for p in pools}
    assert by_pool["sram"]["roles"] == {"fast_scratch": round(fast / 1024, 3)}
    assert set(by_pool["dram"]["roles"]) == {"constants", "command_stream", "arena"}


def test_vela_options_from_the_spec_reach_vela_and_the_manifest(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]",
                                             "targets: [ethos-u55-128]\n"
                                             "vela: {output_format: raw, optimise: Size, tensor_allocator: Greedy}"))
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 0, err
    b = read_report(build_dir)["builds"][0]
    vela_dir = Path(b["artifacts"]["vela"]).parent
    assert b["artifacts"]["vela"].endswith("model_vela.npz") and not list(vela_dir.glob("*.tflite"))
    npz = Path(b["artifacts"]["vela"])  # model_vela.npz, or u55_model_vela.npz where U55 lowers it its own way
    assert npz.name == "u55_model_vela.npz"  # DS-CNN's U55 graph has its own forms (the space-to-depth stem) ...
    assert b["metrics"]["firmware"][0]["prefix"] == "npubuild_model"  # ... its firmware names stay the model's
    # one Vela run: its .tflite (what is deployed) in tflite/, the raw output written from it
    assert [p.name for p in (vela_dir / "tflite").iterdir()] == ["u55_model_vela.tflite"]
    assert not (vela_dir / "raw").exists()
    manifest = json.loads((vela_dir / b["metrics"]["firmware"][0]["manifest"]).read_text())
    assert manifest["vela_options"]["optimise"] == "Size" and manifest["vela_options"]["tensor_allocator"] == "Greedy"
    with np.load(npz) as z:
        assert manifest["arena_size"] == int(z["scratch_size"]) == b["metrics"]["memory"]["arena_bytes"]
        assert z["weight_data"].tobytes() == _vela_operator(vela_dir).model.weights


def test_a_vela_stage_served_from_the_shared_cache_keeps_its_model_and_firmware(tmp_path: Path, capsys,
                                                                                     monkeypatch):
    monkeypatch.setenv("NPUBUILD_CACHE", str(tmp_path / "cache"))
    dirs = []
    for name in ("first", "second"):
        build_dir = tmp_path / name
        code, _, err = run_cli(["compile", str(REPO / "configs" / "models" / "ds_cnn.onnx"), "--target",
                                "ethos-u55-128", "--build-dir", str(build_dir), "--json"], capsys, cwd=tmp_path)
        assert code == 0, err
        dirs.append(next((build_dir / "stages" / "vela").glob("ds_cnn-*")))
    assert json.loads((dirs[1] / "stage.json").read_text()).get("from_cache") is True
    tflite = next(dirs[0].glob("*_vela.tflite")).relative_to(dirs[0])
    for rel in (str(tflite), "firmware/npubuild_model.h", "firmware/npubuild_model.c", "firmware/npubuild_model.json",
                "firmware/npubuild_deployable.tflite"):
        assert (dirs[1] / rel).read_bytes() == (dirs[0] / rel).read_bytes(), rel


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 33, 256])
def test_byte_arrays_are_lowercase_hex_sixteen_to_a_row(length: int):
    from npubuild.ethosu.firmware import _bytes_c

    data = bytes((7 * i + 255) % 256 for i in range(length))  # every byte value once at 256
    rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 16]) for i in range(0, length, 16)]
    assert _bytes_c(data) == (",\n    ".join(rows) if rows else "0x00")
    assert length < 256 or {f"0x{b:02x}" for b in range(256)} <= set(_bytes_c(data).replace(",\n    ", ", ").split(", "))


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 31, 32, 33, 256, 4097])
@pytest.mark.parametrize("sep", [",\n  ", ",\n    ", ",\n   "])
def test_hex_text_is_the_rows_joined(length: int, sep: str):
    """hex_text writes the rows into one array (numpy): the very text of hex_rows joined, for full rows, a short
    last row, no data, and a separator of odd width (which it leaves to hex_rows)."""
    from npubuild.deploy.package import hex_rows, hex_text

    data = bytes((7 * i + 255) % 256 for i in range(length))
    assert hex_text(data, sep) == sep.join(hex_rows(data))
