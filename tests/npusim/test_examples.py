"""Issue 8 acceptance: every example model in configs/ that builds for U55/U65 runs in npu-sim
bit-exact against the TOSA reference model, on several inputs, for a Performance and a Size build.

Each spec in configs/ is rebuilt with its targets replaced by raw-output U55 profiles (so the npu-sim
stage is planned); the stage itself asserts bit-exactness on the tosa-check samples.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from npbtest import REPO, read_report, run_cli

RAW_TARGETS = [
    {"extends": "ethos-u55-128", "name": "u55-raw", "vela": {"output_format": "raw"}},
    {"extends": "ethos-u55-128", "name": "u55-raw-size", "vela": {"output_format": "raw", "optimise": "Size"}},
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
    for b in report["builds"]:
        where = f"{b['spec']}/{b['model']}/{b['target']}"
        assert b["stages"]["npu-sim"]["status"] == "passed", (where, b["stages"]["npu-sim"], err)
        assert b["metrics"]["npusim_bitexact"] is True, where
    assert code == 0, err
