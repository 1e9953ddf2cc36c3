"""A model's external data is an input of its import task: an edit to the weights file beside an unchanged
.onnx re-runs the import (and what follows) on both executors, and the shared cache never hands back the
import of the old weights (the key holds every companion file's content)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO, read_report, read_run

from npubuild.config.load import load_specs
from npubuild.stages import STAGES

SPEC = ("version: 1\nname: ext\nmodels:\n  ext: {path: models/ext.onnx, input_shapes: {input: [1, 1, 49, 10]}}\n"
        "targets: [ethos-u55-128]\nverify: {tosa: true, samples: 2}\n")


def _save(model: onnx.ModelProto, path: Path) -> None:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.weights", size_threshold=0)


def _project(root: Path) -> Path:
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    _save(onnx.load(str(REPO / "configs" / "models" / "ds_cnn.onnx")), root / "configs" / "models" / "ext.onnx")
    (root / "configs" / "ext.yaml").write_text(SPEC)
    return root


def _halve_the_first_weights(models: Path) -> None:
    """New values for the first float tensor, written into ext.weights in place; ext.onnx is not touched."""
    proto = onnx.load(str(models / "ext.onnx"), load_external_data=False)
    t = next(t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    where = {e.key: e.value for e in t.external_data}
    offset, length = int(where.get("offset", 0)), int(where["length"])
    with open(models / "ext.weights", "r+b") as f:
        f.seek(offset)
        values = np.frombuffer(f.read(length), np.float32) * np.float32(0.5)
        f.seek(offset)
        f.write(values.tobytes())


def _imported(build_dir: Path) -> str:
    (path,) = build_dir.glob("stages/import/*/model.onnx")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import Client, LocalCluster

    c = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    client = Client(c)
    yield client
    client.close()
    c.close()


def _build(executor: str, project: Path, client) -> dict:
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import build_and_report

    result = build_and_report(load_specs([project / "configs"]), project / "build", STAGES,
                              RunOptions(quiet=True, executor=executor, cache=str(project / "cache")),
                              client=client if executor == "dask" else None)
    assert result.exit_code == 0, result.report["builds"][0]["errors"]
    return read_run(project / "build")


@pytest.mark.parametrize("executor", ["doit", "dask"])
def test_an_edited_external_data_file_reruns_the_import(executor: str, tmp_path: Path, request, monkeypatch):
    client = request.getfixturevalue("cluster") if executor == "dask" else None
    project = _project(tmp_path / "product")
    monkeypatch.chdir(project)
    _build(executor, project, client)
    first = _imported(project / "build")
    record = next((project / "build").glob("stages/import/*/inputs.json"))
    assert set(json.loads(record.read_text())["inputs"]) == {"model", "model/ext.weights"}

    _halve_the_first_weights(project / "configs" / "models")
    run = _build(executor, project, client)
    assert any(n.startswith("import:") for n in run["executed"]), run
    assert not any(n.startswith("import:") for n in run["from_cache"]), run  # not the old weights' entry
    assert _imported(project / "build") != first
    (entry,) = read_report(project / "build")["builds"]
    assert entry["status"] == "passed" and not entry["stages"]["import"]["cached"]
