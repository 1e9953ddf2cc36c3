"""Every example model in configs/ runs in npu-sim bit-exact against the TOSA reference model, on several inputs,
for U55 (Performance and Size builds), U65 and every Ethos-U85 size.

Each spec in configs/ is rebuilt with its targets replaced by the named U55-128, U65-256 and U85-256 profiles (the
default flow: Vela writes .tflite and npu-sim runs its ethos-u operator) and raw-output profiles; the stage itself
asserts bit-exactness on the tosa-check samples (3 per model). One build covers
all targets, so the import, quantize, lower and tosa-check stages run once per model.

U85 coverage, chosen for run time (a target costs one Vela compile and one npu-sim run per model): every
size with every model; both optimisation strategies on U85-256 (the examples' own U85 target); Size on
U85-512 and U85-2048 (two and four weight decoders, where Size picks the fast weight format and its
interleaved streams) and Performance on U85-128 and U85-1024 (one and four decoders, the two lowering
families: u85 and u85wide).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from npbtest import REPO, read_report, run_cli


def _raw(accel: str, optimise: str = "Performance") -> dict:
    name = accel.removeprefix("ethos-").replace("-", "") + ("-size" if optimise == "Size" else "")
    vela = {"output_format": "raw"} | ({"optimise": "Size"} if optimise == "Size" else {})
    return {"extends": accel, "name": name, "vela": vela}


RAW_TARGETS = [
    "ethos-u55-128", "ethos-u65-256", "ethos-u85-256",  # the default flow: Vela writes .tflite, npu-sim runs it
    _raw("ethos-u55-128", "Size"),
    _raw("ethos-u85-128"), _raw("ethos-u85-256", "Size"), _raw("ethos-u85-512", "Size"),
    _raw("ethos-u85-1024"), _raw("ethos-u85-2048", "Size"),
]


def test_every_example_is_bit_exact_in_npu_sim(tmp_path: Path, capsys):
    root = tmp_path / "product"
    shutil.copytree(REPO / "configs", root / "configs")
    (root / "dodo.py").write_text("# marker\n")
    specs = sorted((root / "configs").glob("*.yaml"))
    for spec in specs:
        data = yaml.safe_load(spec.read_text())
        data["targets"] = RAW_TARGETS
        data["verify"] = {**data.get("verify", {}), "samples": 3}
        data.pop("expect", None)  # the examples' own gates are checked by their own tests
        spec.write_text(yaml.safe_dump(data, sort_keys=False))
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q", "-n", "2", "--progress", "plain"],
                           capsys, cwd=root)
    report = read_report(root / "build")
    models = {(b["spec"], b["model"]) for b in report["builds"]}
    assert len(models) >= 12, models
    assert {b["accelerator"] for b in report["builds"]} >= {f"ethos-u85-{m}" for m in (128, 256, 512, 1024, 2048)}
    assert len(report["builds"]) == len(models) * len(RAW_TARGETS)
    for b in report["builds"]:
        where = f"{b['spec']}/{b['model']}/{b['target']}"
        assert b["stages"]["npu-sim"]["status"] == "passed", (where, b["stages"]["npu-sim"], err)
        assert b["metrics"]["npusim_bitexact"] is True, where
    assert code == 0, err
