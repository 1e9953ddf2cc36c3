"""What a build prints and writes, as a user and a CI log see it: failures named per build, a result line
per finished build (depth-first, so they come early), -q still closing with the summary, a no-op build
that prints one line, shared-cache restores counted apart, `clean` keeping that cache, the project found
from a subdirectory, and side commands (offloads, debug-numerics, compile) leaving the project's reports
alone."""

from __future__ import annotations

import json
from pathlib import Path

from npbtest import read_report, read_run, run_cli

from npubuild.config.load import load_specs
from npubuild.engine.plan import make_plan
from npubuild.engine.progress import StageProgress
from npubuild.stages import STAGES

TINY = "{extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 1}}}"
KWS = ("kws/ds_cnn/ethos-u55-128", "kws/ds_cnn/ethos-u65-256", "kws/ds_cnn/ethos-u85-256")


def _with_tiny_target_first(project: Path) -> None:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128,", f"targets: [{TINY}, ethos-u55-128,"))


def test_plain_progress_names_each_failed_build_and_prints_results_as_builds_finish(project: Path, capsys):
    _with_tiny_target_first(project)
    code, out, err = run_cli(["build", "--progress", "plain", "--keep-going"], capsys, cwd=project / "configs")
    assert code == 1
    assert (project / "build" / "report.json").is_file()  # the project's build/, found from configs/
    # the failed task's one stderr line names the build and the stage, not only the target
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: kws/ds_cnn/u55-tiny: vela: target 'u55-tiny': pool "
                                                     "'sram'"), err
    lines = out.splitlines()
    assert any(ln.startswith("[") and " failed  vela:ds_cnn-u55-tiny-" in ln for ln in lines)
    # one result line per finished build: the failure with its cause, the others with their figures
    failed = [ln for ln in lines if ln.startswith("FAILED ")]
    assert failed == [next(ln for ln in lines if ln.startswith("FAILED kws/ds_cnn/u55-tiny: vela: target "))]
    ok = {ln.split()[1]: ln for ln in lines if ln.startswith("ok ")}
    assert set(ok) == set(KWS)
    assert all(" ms (" in ln and " inf/s)" in ln and "sram " in ln and "NPU 100%" in ln for ln in ok.values())
    # depth-first: builds finish while others still run, not all at the end
    first_result = next(i for i, ln in enumerate(lines) if ln.startswith(("ok ", "FAILED ")))
    last_start = max(i for i, ln in enumerate(lines) if "] run     " in ln)
    assert first_result < last_start
    assert "failed builds (1):" in out and "  kws/ds_cnn/u55-tiny: vela: target 'u55-tiny': pool 'sram'" in out
    assert lines[-1].startswith("14 ran, 0 cached, 1 failed, 0 restored from the shared cache; builds: 3 passed, "
                                "1 failed, 0 skipped")

    # -q: no per-task or per-build lines, but the failed builds and the closing summary with the report path
    code, out, _ = run_cli(["build", "-q", "--keep-going"], capsys, cwd=project)
    assert code == 1
    lines = out.splitlines()
    assert lines == ["failed builds (1):", lines[1], lines[2]] and "u55-tiny: vela: " in lines[1]
    assert lines[2].startswith("0 ran, 14 cached, 1 failed") and lines[2].endswith(
        f"report: {project / 'build' / 'report.json'}")


def test_a_noop_build_prints_one_line_and_verbose_lists_what_was_up_to_date(project: Path, capsys):
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    code, out, _ = run_cli(["build", "--progress", "plain"], capsys, cwd=project)
    assert code == 0 and len(out.splitlines()) == 1 and out.startswith("0 ran, 14 cached, 0 failed")
    code, out, _ = run_cli(["build", "--progress", "plain", "-v"], capsys, cwd=project)
    lines = out.splitlines()
    assert sum(" cached  " in ln for ln in lines) == 14 and sum(ln.startswith("ok ") for ln in lines) == 3


def test_clean_keeps_the_shared_cache_and_restores_are_counted_apart_from_ran(project: Path, capsys):
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    cache = project / ".npubuild" / "cache"
    assert cache.is_dir() and not (project / "build" / "cache").exists()  # not in the build dir
    assert run_cli(["clean"], capsys, cwd=project)[0] == 0
    assert cache.is_dir() and not (project / "build" / "stages").exists()
    code, out, _ = run_cli(["build", "--progress", "plain"], capsys, cwd=project)
    assert code == 0
    run = read_run(project / "build")
    assert len(run["from_cache"]) == 11 and set(run["executed"]) - set(run["from_cache"]) == {
        f"report:{b}" for b in KWS}  # the per-build report tasks are never in the shared cache
    assert out.splitlines()[-1].startswith("3 ran, 0 cached, 0 failed, 11 restored from the shared cache")


def test_side_commands_leave_the_projects_reports_alone(project: Path, capsys):
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    build_dir = project / "build"
    files = ("report.json", "report.md", "report.html", "run.json")
    before = {f: (build_dir / f).read_bytes() for f in files}
    code, out, err = run_cli(["offloads", "configs/kws.yaml", "--target", "ethos-u55-128"], capsys, cwd=project)
    assert code == 0 and "-> NPU partition 0" in out and not err
    code, out, err = run_cli(["debug-numerics", "configs/kws.yaml", "--target", "ethos-u55-128", "--samples", "2"],
                             capsys, cwd=project)
    assert code == 0, err
    code, out, err = run_cli(["compile", "configs/models/ds_cnn.onnx", "--target", "ethos-u65-256", "--json"],
                             capsys, cwd=project)
    assert code == 0, err
    assert json.loads(out)["target"] == "ethos-u65-256"  # stdout is the JSON alone
    assert {f: (build_dir / f).read_bytes() for f in files} == before
    compiled = read_report(build_dir / "compile")  # compile's own report
    assert [b["spec"] for b in compiled["builds"]] == ["adhoc"]
    # the next build of the project (nothing to do) shows debug-numerics' result in its report
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    entries = {b["target"]: b for b in read_report(build_dir)["builds"]}
    assert "layer_numerics" in entries["ethos-u55-128"] and "layer_numerics" not in entries["ethos-u85-256"]
    assert len(entries) == 3


def test_progress_bar_counts_builds_and_failures_and_estimates_the_time_left(project: Path):
    from rich.console import Console

    plan = make_plan(load_specs([project / "configs"]), project / "build", STAGES)
    progress = StageProgress(plan)
    assert progress.bar().startswith("[>") and "0/14 tasks, 0/3 builds" in progress.bar()
    assert "ETA" not in progress.bar()  # nothing ran yet: no estimate
    names = list(plan.tasks)
    for name in names[:5]:  # the shared import, early-fit, quantize, lower, tosa-check tasks
        progress.mark(name, "running")
        progress.mark(name, "ran")
    progress.build_finished(KWS[0], "vela: target 'ethos-u55-128': pool 'sram' needs 9.0 KiB but has 1.0 KiB")
    bar = progress.bar()
    assert "5/14 tasks, 1/3 builds, 1 failed" in bar and "ETA " in bar
    assert progress.eta() is not None and progress.eta() >= 0
    progress.mark(names[-1], "blocked")  # not run, an upstream task failed: done all the same
    assert progress.tasks_done == 6
    console = Console(record=True, width=120, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(progress.table())
    text = console.export_text()
    assert "FAILED kws/ds_cnn/ethos-u55-128: vela: target 'ethos-u55-128': pool 'sram'" in text
    header = next(ln for ln in text.splitlines() if "stage" in ln and "done" in ln)
    for col in ("ran", "cached", "restored", "failed", "running"):
        assert col in header
