"""Issue 19: Dask workers that share nothing with the client but the cache URL, on a real `distributed` cluster.

The workers are `dask worker` subprocesses, each in its own temporary cwd and its own mount namespace in
which the client's whole directory (project, specs, models, data, build dirs) is an empty tmpfs: a stage
that opened any client path would fail. Only the shared cache directory, a sibling, is visible to them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest import REPO, read_report, read_run, run_cli

from npubuild.config.load import load_specs
from npubuild.engine.dask_executor import is_loopback, require_shared_cache
from npubuild.errors import InputError
from npubuild.stages import STAGES

# the worker's own mount namespace: an empty tmpfs over the client's directory, then the worker in its cwd
HIDE_AND_RUN = 'mount -t tmpfs tmpfs "$1" && cd "$2" && shift 2 && exec "$@"'


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-Urm", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _example_project(root: Path) -> Path:
    """kws (one model, three targets, random calibration) and digits (calibration and evaluation arrays)."""
    (root / "configs" / "models").mkdir(parents=True)
    (root / "configs" / "data").mkdir()
    (root / "dodo.py").write_text("# product repo marker\n")
    for rel in ("kws.yaml", "digits.yaml", "models/ds_cnn.onnx", "models/digits_cnn.onnx",
                "data/digits_calib.npy", "data/digits_eval_inputs.npy", "data/digits_eval_labels.npy"):
        shutil.copy(REPO / "configs" / rel, root / "configs" / rel)
    return root


def _metrics(build_dir: Path) -> dict:
    return {(b["spec"], b["model"], b["target"]): b["metrics"] for b in read_report(build_dir)["builds"]}


def _files(build_dir: Path) -> set[str]:
    return {p.relative_to(build_dir).as_posix() for d in ("stages", "builds") for p in (build_dir / d).rglob("*")
            if p.is_file()}


@pytest.fixture
def hidden_cluster(tmp_path: Path):
    """(client, the client's directory, the shared cache dir): a scheduler here, two worker subprocesses that
    see neither the client's directory nor its cwd."""
    if not _namespaces_work():
        pytest.skip("needs `unshare -Urm` (user and mount namespaces) to hide the client's files from the workers")
    from dask.distributed import Client, LocalCluster

    client_dir, cache = tmp_path / "client", tmp_path / "shared-cache"
    client_dir.mkdir()
    cache.mkdir()
    cluster = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_")}
    env["PYTHONPATH"] = str(REPO)
    workers = []
    try:
        for i in range(2):
            cwd = tmp_path / f"worker-{i}"
            cwd.mkdir()
            workers.append(subprocess.Popen(
                ["unshare", "-Urm", "sh", "-c", HIDE_AND_RUN, "sh", str(client_dir), str(cwd),
                 sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--local-directory", str(cwd), "--name", f"hidden-{i}"],
                env={**env, "TMPDIR": str(cwd)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        client = Client(cluster)
        client.wait_for_workers(2, timeout=120)
        yield client, client_dir, cache
        client.close()
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        cluster.close()


def test_workers_that_see_only_the_cache_build_what_doit_builds_and_a_second_client_restores_it(
        hidden_cluster, monkeypatch):
    from dask.distributed import get_task_stream

    from npubuild.engine.run import RunOptions
    from npubuild.report.run import build_and_report

    client, client_dir, cache = hidden_cluster
    project = _example_project(client_dir / "product")
    # the workers really are blind to the client: no project, no cwd of the client's, their own cwd
    assert set(client.run(os.path.exists, str(project / "configs" / "kws.yaml")).values()) == {False}
    assert all(Path(cwd).name.startswith("worker-") for cwd in client.run(os.getcwd).values())

    doit_dir, dask_dir, second_dir = client_dir / "b-doit", client_dir / "b-dask", client_dir / "b-second"
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(doit_dir), "-q", "-n", "2",
                           "--cache", str(client_dir / "cache-doit")], cwd=project, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr

    monkeypatch.chdir(project)
    builds = load_specs([project / "configs"])
    with get_task_stream(client) as stream:
        result = build_and_report(builds, dask_dir, STAGES, RunOptions(cache=str(cache), executor="dask", quiet=True),
                                  client=client)
    assert result.exit_code == 0, result.failed
    assert _metrics(dask_dir) == _metrics(doit_dir) and len(_metrics(doit_dir)) == 5
    assert _files(dask_dir) == _files(doit_dir)  # every stage output and firmware file is in the build dir
    remote = {t for t in result.plan.tasks if not result.plan.tasks[t].per_build}
    ran_on_workers = {rec["key"].rsplit("@", 1)[0] for rec in stream.data}
    assert ran_on_workers == remote  # every stage but the report ran on a blind worker
    run = read_run(dask_dir)
    assert run["executor"] == "dask" and run["from_cache"] == [] and sorted(run["executed"]) == sorted(result.plan.tasks)
    firmware = [p for p in dask_dir.glob("stages/vela/*/firmware/*") if p.is_file()]
    assert firmware and all(p.stat().st_size > 0 for p in firmware)

    # a second client, a fresh build dir, through the CLI: everything comes back from the cache, nothing runs
    with get_task_stream(client) as second_stream:
        proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(second_dir), "--executor",
                               "dask", "--scheduler", client.scheduler.address, "--cache", str(cache), "--progress",
                               "plain"], cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (f"{len(result.plan.tasks) - len(remote)} ran, 0 cached, 0 failed, {len(remote)} restored from the shared "
            "cache; builds: 5 passed") in proc.stdout
    assert read_run(second_dir)["from_cache"] == sorted(remote)
    assert _metrics(second_dir) == _metrics(doit_dir) and _files(second_dir) == _files(doit_dir)
    for p in second_dir.glob("stages/*/*/stage.json"):
        assert json.loads(p.read_text())["from_cache"] is True
    assert second_stream.data == []  # restored by the client itself: no worker ran a stage

    # nothing to run: no cluster is needed, so a scheduler nobody listens on is never dialled
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(second_dir), "--executor",
                           "dask", "--scheduler", "tcp://127.0.0.1:1", "--cache", str(cache)], cwd=project,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"0 ran, {len(result.plan.tasks)} cached, 0 failed, 0 restored")


def test_no_reachable_cache_is_one_line_and_exit_2(tmp_path: Path, capsys, project: Path):
    code, out, err = run_cli(["build", "--build-dir", str(tmp_path / "b"), "--executor", "dask", "--cache", "off"],
                             capsys, cwd=project)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --executor dask needs the shared stage cache") and not (tmp_path / "b").exists()

    code, out, err = run_cli(["build", "--build-dir", str(tmp_path / "b"), "--executor", "dask", "--scheduler",
                              "tcp://10.20.30.40:8786", "--cache", str(tmp_path / "cache")], capsys, cwd=project)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is a directory on this machine" in err and "tcp://10.20.30.40:8786" in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "cache").exists()


def test_which_caches_a_cluster_can_reach():
    assert is_loopback("tcp://127.0.0.1:8786") and is_loopback("localhost:8786") and is_loopback("inproc://x/1")
    assert not is_loopback("tcp://10.0.0.5:8786") and not is_loopback("tls://scheduler.example:8786")
    require_shared_cache("/shared/cache", "tcp://127.0.0.1:8786", own_cluster=False)  # same machine: fine
    require_shared_cache("file:///nfs/cache", "tcp://10.0.0.5:8786", own_cluster=False)  # a URL: the user's word
    require_shared_cache("s3://bucket/cache", "tcp://10.0.0.5:8786", own_cluster=False)
    with pytest.raises(InputError, match="in this process's memory"):
        require_shared_cache("memory://cache", None, own_cluster=True)
    with pytest.raises(InputError, match="cannot reach"):
        require_shared_cache("/home/me/cache", "tcp://10.0.0.5:8786", own_cluster=False)


TINY = "{extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 1}}}"
BROKEN = "version: 1\nname: broken\nmodels:\n  bad: {path: models/bad.onnx}\ntargets: [ethos-u55-128]\n"


def _summary(out: str) -> str:
    """The closing line up to its wall time (the report path after it names the build dir)."""
    line = out.splitlines()[-1]
    return line[:line.rindex(" (")]


def test_failures_progress_summary_and_run_json_are_the_doits(project: Path, capsys):
    """A Vela pool failure and a model that is not ONNX, with --keep-going: the same stderr lines (the
    worker's temporary paths put back as the user's), result lines, summary, run.json and exit code."""
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128,", f"targets: [{TINY}, ethos-u55-128,"))
    (project / "configs" / "broken.yaml").write_text(BROKEN)
    (project / "configs" / "models" / "bad.onnx").write_bytes(b"not a model at all")
    seen = {}
    for executor in ("doit", "dask"):
        build_dir = project / f"b-{executor}"
        code, out, err = run_cli(["build", "--build-dir", str(build_dir), "--progress", "plain", "--keep-going",
                                  "--executor", executor, "--cache", str(project / f"cache-{executor}"), "-n", "2"],
                                 capsys, cwd=project)
        run = read_run(build_dir)
        report = read_report(build_dir)
        seen[executor] = {
            "code": code, "errors": sorted(ln for ln in err.splitlines() if ln.startswith(("error", str(project)))),
            "results": sorted(ln.split("  ")[0] for ln in out.splitlines() if ln.startswith(("ok ", "FAILED "))),
            "failed_builds": [ln for ln in out.splitlines() if ln.startswith("  ")], "summary": _summary(out),
            "run": {k: v for k, v in run.items() if k not in ("run_id", "executor")},
            "status": {b["model"] + "/" + b["target"]: (b["status"], b.get("error_kinds")) for b in report["builds"]}}
        assert run["executor"] == executor
    assert seen["dask"] == seen["doit"]
    assert seen["doit"]["code"] == 2  # the model that is not ONNX is bad input
    assert any("bad.onnx" in ln and str(project) in ln for ln in seen["dask"]["errors"]), seen["dask"]["errors"]
    assert not any("npubuild-task-" in ln for ln in seen["dask"]["errors"])
    assert seen["dask"]["summary"].startswith("14 ran, 0 cached, 2 failed, 0 restored from the shared cache; builds: "
                                              "3 passed, 2 failed")

    # without --keep-going, as doit without it: the tasks already running finish, no other one starts
    code, out, err = run_cli(["build", "--build-dir", str(project / "b-stop"), "-q", "--executor", "dask", "--cache",
                              str(project / "cache-stop"), "-n", "2"], capsys, cwd=project)
    run = read_run(project / "b-stop")
    assert code == 2 and run["failed"] and run["blocked"] == []
    assert len(run["executed"]) + len(run["failed"]) < len(seen["dask"]["run"]["executed"]) + 2


def test_a_worker_task_needs_no_client_path_even_for_a_model_with_external_data(tmp_path: Path):
    """The worker's function on its own: planned and addressed by the client, then run with the project
    moved away (no path of the client's exists), its outputs restored into the stage dir afterwards."""
    import onnx

    from npubuild.engine.cache import StageCache
    from npubuild.engine.plan import make_plan
    from npubuild.engine.shipping import Shipping
    from npubuild.engine.uptodate import is_done
    from npubuild.engine.worker import run_remote

    project = tmp_path / "product"
    (project / "configs" / "models").mkdir(parents=True)
    (project / "dodo.py").write_text("# marker\n")
    model = onnx.load(str(REPO / "configs" / "models" / "ds_cnn.onnx"))
    onnx.save_model(model, str(project / "configs" / "models" / "ext.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)
    (project / "configs" / "ext.yaml").write_text(
        "version: 1\nname: ext\nmodels:\n  ext: {path: models/ext.onnx, input_shapes: {input: [1, 1, 49, 10]}}\n"
        "targets: [ethos-u55-128]\n")
    plan = make_plan(load_specs([project / "configs"]), project / "build", STAGES)
    cache = StageCache(str(tmp_path / "cache"))
    shipping = Shipping(plan, cache)
    assert shipping.publish_user_inputs() == 1
    task = plan.tasks[plan.build_tasks["ext/ext/ethos-u55-128"]["import"]]
    prepared = shipping.prepare(task, "run-1")
    assert prepared.remote is not None
    assert str(project) not in json.dumps(prepared.remote.inputs, default=str)  # addresses, no paths

    moved = tmp_path / "moved-away"
    project.rename(moved)
    try:
        result = run_remote(prepared.remote, cache.url, "run-1")
    finally:
        moved.rename(project)
    assert result.status == "ran", result.error
    assert shipping.finish(task, prepared, result, "run-1") is None and is_done(task)
    imported = onnx.load(str(task.outputs["onnx"]))  # the weights came along in the model's entry, folded in
    assert imported.graph.initializer and all(t.data_location == onnx.TensorProto.DEFAULT and t.raw_data
                                              for t in imported.graph.initializer)
