"""Every stage task runs in a child process under the memory limit, with doit's processes and on Dask's
workers (whose tasks run on a thread: the child comes from a forkserver), with the shared cache on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO, read_report, read_run
from npbtest.onnx_cases import conv
from onnx import TensorProto, helper, numpy_helper

from npubuild.engine.isolate import run_isolated
from npubuild.errors import InputError

LIMIT_MIB = 512  # kws's stages add ~150 MiB of address space; 60 calibration samples of 16 MiB do not fit


def _big_model() -> onnx.ModelProto:
    """One 1x1 conv on a 16x512x512 map: its 60 float calibration samples take 960 MiB in quantize."""
    w = np.random.default_rng(0).uniform(-1, 1, (16, 16, 1, 1)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv0")], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _night(project: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_CACHE")}  # the project's cache
    env["NPUBUILD_STAGE_MEMORY_MIB"] = str(LIMIT_MIB)
    return subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--keep-going", *extra], cwd=project,
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("executor", ["doit", "dask"])
def test_a_stage_over_the_memory_limit_fails_its_build_only_with_either_executor(project: Path, executor: str):
    onnx.save(_big_model(), project / "configs" / "models" / "big.onnx")
    (project / "configs" / "big.yaml").write_text(
        "version: 1\nname: big\nmodels:\n  big:\n    path: models/big.onnx\n"
        "    calibration: {random: {samples: 60, seed: 0}}\n"
        "targets: [{extends: ethos-u55-128, name: u55-big-sram, pools: {sram: {size_kib: 32768}}}]\n"
        "verify: {tosa: true, samples: 2}\n")
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    args = ("--executor", "dask") if executor == "dask" else ("-n", "2")
    for night in range(2):  # the second night: kws from its stage dirs, the big one fails the same way again
        proc = _night(project, *args)
        assert proc.returncode == 1, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert errors == [f"error: big/big/u55-big-sram: quantize: the quantize stage needs more than {LIMIT_MIB} "
                          "MiB of memory ($NPUBUILD_STAGE_MEMORY_MIB raises the limit)"], proc.stderr
        assert "Traceback" not in proc.stderr
        builds = {b["spec"]: b["status"] for b in read_report(project / "build")["builds"]}
        assert builds == {"kws": "passed", "big": "failed"}
        run = read_run(project / "build")
        assert [n.split(":")[0] for n in run["failed"]] == ["quantize"], run
        if night == 1:
            assert run["executed"] == [] and len(run["cached"]) == 10, run  # kws's 8 tasks, big's import and early-fit
    assert (project / ".npubuild" / "cache").is_dir()  # the shared cache was on throughout
    records = [json.loads(p.read_text()) for p in (project / "build").glob("stages/quantize/*/stage.json")]
    assert len(records) == 1  # kws's; the failed task left no record


# the stages after the import, any of which can be the first over a tight limit
LATER_STAGES = ("quantize", "lower", "tosa-check", "vela")


def _in_a_thread(model: onnx.ModelProto) -> dict:
    out: dict = {}

    def go():
        try:
            out["value"] = run_isolated(onnx.shape_inference.infer_shapes, model, what="shape inference",
                                        where="m.onnx")
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=go)
    t.start()
    t.join(timeout=300)
    return out


def test_off_the_main_thread_a_native_crash_is_still_one_error():
    """A Dask worker runs tasks on a thread, where forking is unsafe: its children come from a forkserver, and
    the real SIGFPE of onnx's shape inference (strides 0) is one line there too."""
    out = _in_a_thread(conv(strides=[0, 0]))
    assert isinstance(out.get("error"), InputError), out
    assert str(out["error"]) == "m.onnx: error: shape inference crashed on this model (SIGFPE: Floating point exception)"
    out = _in_a_thread(conv())
    assert {vi.name for vi in out["value"].graph.value_info} == {"c"}


def _wide_model() -> onnx.ModelProto:
    """One 1x1 conv on a 16x256x256 map: its import needs under 3 MiB more than the build process, its
    quantize (16 float calibration samples of 4 MiB, and their outputs) over 40 MiB."""
    w = np.random.default_rng(0).uniform(-1, 1, (16, 16, 1, 1)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv0")], "wide",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 256, 256])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("mib", "stages", "code"), [(1, ("import",), 2), (10, LATER_STAGES, 1),
                                                    (20, LATER_STAGES, 1)])
def test_a_limit_too_small_for_the_stage_is_the_memory_line_not_the_models_fault(project: Path, mib: int,
                                                                                stages: tuple[str, ...], code: int):
    """Under a tight limit onnxruntime's thread pool cannot start and lazily imported libraries cannot be
    mapped: that was 'internal error ... ImportError' (10 MiB), 'the model is too large or too deeply nested'
    (50 MiB) or 'node conv_3 (Conv): onnxruntime cannot run it' (100 MiB). It is the limit, said as such, and
    the stage's imports happen before the limit is set. The later stages' cases build a model whose import
    needs under 3 MiB and whose quantize needs over 40 (measured): kws's stages need 2-3 (import), 4-6
    (quantize) and 10-12 MiB (tosa-check) on this machine, too close to any fixed limit for a test that must
    not depend on the machine or its load (at 20 MiB no kws stage goes over any more)."""
    spec = project / "configs" / "kws.yaml"
    if mib == 1:
        spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    else:
        spec.unlink()
        onnx.save(_wide_model(), project / "configs" / "models" / "wide.onnx")
        (project / "configs" / "wide.yaml").write_text(
            "version: 1\nname: wide\nmodels:\n  m:\n    path: models/wide.onnx\n"
            "    calibration: {random: {samples: 16, seed: 0}}\ntargets: [ethos-u85-256]\n"
            "verify: {tosa: true, samples: 4}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_CACHE")}
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--cache", "off"], cwd=project,
                          env={**env, "NPUBUILD_STAGE_MEMORY_MIB": str(mib)}, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert lines and proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr  # 2: an import failure
    # the child says it ran out; or, where it could not even report (an exit status, no result), the parent names
    # the limit: either way each line is the limit and the variable that raises it, never the model's fault (two
    # independent later stages, the TOSA check and Vela, can each be the one over it)
    for line in lines:
        said = re.search(rf"([a-z-]+): the \1 stage (needs more than {mib} MiB of memory|ended without a result.*"
                         rf"under the {mib} MiB stage memory limit that is most often memory) "
                         r"\(\$NPUBUILD_STAGE_MEMORY_MIB raises the limit\)$", line)
        assert said and said.group(1) in stages, proc.stderr


def _no_core() -> None:  # the stand-ins crash on purpose: no core file in the test's directory
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _abort() -> None:  # what native code does when an allocation fails (std::bad_alloc -> std::terminate)
    _no_core()
    os.abort()


def _segfault() -> None:
    _no_core()
    os.kill(os.getpid(), 11)


def test_an_abort_names_the_memory_limit_and_other_crashes_do_not():
    """A SIGABRT in a stage is as often a failed allocation under the memory limit as a bug: its line names the
    limit and the variable that raises it; a SIGSEGV's line does not."""
    with pytest.raises(InputError) as info:
        run_isolated(_abort, what="the stand-in", where="m.onnx", memory_bytes=96 << 20)
    assert str(info.value) == ("m.onnx: error: the stand-in crashed on this model (SIGABRT: Aborted; a native "
                               "allocation that fails under the 96 MiB stage memory limit "
                               "($NPUBUILD_STAGE_MEMORY_MIB) ends so too)")
    with pytest.raises(InputError) as info:
        run_isolated(_segfault, what="the stand-in", where="m.onnx", memory_bytes=96 << 20)
    assert str(info.value) == "m.onnx: error: the stand-in crashed on this model (SIGSEGV: Segmentation fault)"


DEEP_TMPDIR_RUN = """
import threading
from npubuild.engine.isolate import run_isolated
out = []
t = threading.Thread(target=lambda: out.append(run_isolated(len, "abc", what="a count")))  # off the main thread
t.start(); t.join()
print(out)
"""


def test_a_stage_off_the_main_thread_runs_under_a_tmpdir_too_deep_for_a_socket(tmp_path: Path):
    """The forkserver binds an AF_UNIX socket under TMPDIR (at most ~107 bytes of path): under a deep TMPDIR, as
    a Dask worker run in its own directory has, every stage failed with 'AF_UNIX path too long' until
    short_socket_dir gave multiprocessing a short temp dir."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-c", DEEP_TMPDIR_RUN], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(deep)}, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[3]", proc.stderr[-2000:]

