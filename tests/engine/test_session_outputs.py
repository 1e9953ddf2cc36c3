"""What a build prints and writes, as a user and a CI log see it: failures named per build, a result line
per finished build (depth-first, so they come early), -q still closing with the summary, a no-op build
that prints one line, shared-cache restores counted apart, `clean` keeping that cache, the project found
from a subdirectory, and side commands (offloads, debug-numerics, compile) leaving the project's reports
alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from npbtest import read_report, read_run, run_cli
from npbtest.terminal import run_on_terminal, screen

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
    # one result line per finished build: the failure where it failed (its error line said why, once), the
    # others with their figures
    assert [ln for ln in lines if ln.startswith("FAILED ")] == ["FAILED kws/ds_cnn/u55-tiny (vela)"]
    assert sum("pool 'sram'" in ln for ln in (out + err).splitlines()) == 1
    ok = {ln.split()[1]: ln for ln in lines if ln.startswith("ok ")}
    assert set(ok) == set(KWS)
    assert all(" ms (" in ln and " inf/s)" in ln and "sram " in ln and "NPU 100%" in ln for ln in ok.values())
    # depth-first: builds finish while others still run, not all at the end
    first_result = next(i for i, ln in enumerate(lines) if ln.startswith(("ok ", "FAILED ")))
    last_start = max(i for i, ln in enumerate(lines) if "] run     " in ln)
    assert first_result < last_start
    assert lines[-1].startswith("14 ran, 0 cached, 1 failed, 0 restored from the shared cache; builds: 3 passed, "
                                "1 failed, 0 skipped")

    # -q: no per-task or per-build lines: the failure's one error line and the closing summary with the report
    code, out, err = run_cli(["build", "-q", "--keep-going"], capsys, cwd=project)
    assert code == 1
    assert err.splitlines() == [errors[0]]
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("0 ran, 14 cached, 1 failed") and lines[0].endswith(
        f"report: {project / 'build' / 'report.json'}")


def test_on_a_terminal_each_failure_is_said_once_and_a_noop_build_leaves_one_line(project: Path, capsys):
    """Issue 35: a failing live build printed each failure three times (the FAILED lines cut at the terminal's
    width in the table's last frame, the gate lines, `failed builds (n):`), the table stayed on screen, and a
    no-op build left the whole table although the README promises one line."""
    _with_tiny_target_first(project)
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("  max_transposes: 0\n", "  max_transposes: 0\n  max_npu_cycles: 100\n"))
    code, raw = run_on_terminal(["build", "--keep-going"], project, columns=300)
    assert code == 1
    seen = screen(raw, 300)
    assert sum("pool 'sram'" in ln for ln in seen) == 1, seen  # the Vela failure, whole, once
    gates = [ln for ln in seen if "gate max_npu_cycles failed" in ln]
    assert len(gates) == 3 and all(ln.startswith("error: kws/ds_cnn/ethos-u") for ln in gates), seen  # one per build
    assert all(re.search(r"npu_cycles = \d+, limit 100$", ln) for ln in gates)  # figures, not raw floats
    assert sorted(ln for ln in seen if ln.startswith("FAILED ")) == [
        "FAILED kws/ds_cnn/ethos-u55-128 (gate max_npu_cycles)", "FAILED kws/ds_cnn/ethos-u65-256 (gate max_npu_cycles)",
        "FAILED kws/ds_cnn/ethos-u85-256 (gate max_npu_cycles)", "FAILED kws/ds_cnn/u55-tiny (vela)"]
    assert not any("stage" in ln and "running" in ln for ln in seen)  # the table went with the run
    assert seen[-1].startswith("14 ran, 0 cached, 1 failed")
    spec.write_text(spec.read_text().replace(f"{TINY}, ", "").replace("  max_npu_cycles: 100\n", ""))
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    code, raw = run_on_terminal(["build"], project, columns=300)
    assert code == 0
    seen = screen(raw, 300)
    assert len(seen) == 1 and seen[0].startswith("0 ran, "), seen


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
    header = out.splitlines()[1]  # its columns apart (two ran together: `max LSB SNR vs float dB`)
    assert re.split(r"\s{2,}", header.strip()) == ["node", "op", "SNR vs QDQ dB", "max LSB", "SNR vs float dB",
                                                    "QDQ vs float dB"]
    code, out, err = run_cli(["compile", "configs/models/ds_cnn.onnx", "--target", "ethos-u65-256", "--json"],
                             capsys, cwd=project)
    assert code == 0, err
    assert json.loads(out)["target"] == "ethos-u65-256"  # stdout is the JSON alone
    code, out, err = run_cli(["compile", "configs/models/ds_cnn.onnx", "--target", "ethos-u65-256"], capsys,
                             cwd=project)
    lines = out.splitlines()  # the result line `build` prints, then the closing summary (issue 35: none)
    assert code == 0 and len(lines) == 2, out + err
    assert re.match(r"ok     adhoc/ds_cnn/ethos-u65-256  [\d.]+ ms \([\d,]+ inf/s\), sram ", lines[0])
    assert lines[1].startswith("0 ran, ") and "builds: 1 passed" in lines[1] and lines[1].endswith(f"{build_dir / 'compile' / 'report.json'}")
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
    assert "5/14 tasks, 1/3 builds, 1 failed" in bar and "ETA " not in bar  # no Vela or report timed yet
    for stage in ("vela", "npu-sim", "report"):
        name = next(n for n, t in plan.tasks.items() if t.stage == stage)
        progress.mark(name, "running")
        progress.mark(name, "ran")
    assert "ETA " in progress.bar() and progress.eta() >= 0
    progress.mark(names[-1], "blocked")  # not run, an upstream task failed: done all the same
    assert progress.tasks_done == 9
    console = Console(record=True, width=160, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(progress.table())
    text = console.export_text()
    assert "pool 'sram'" not in text  # failures are printed above the table, once, not in it
    header = next(ln for ln in text.splitlines() if "stage" in ln and "done" in ln)
    for col in ("ran", "cached", "restored", "failed", "running"):
        assert col in header
    # the table's width does not follow the running column
    widths = {len(ln) for ln in text.splitlines()[1:] if ln.strip()}
    for name in [n for n in names[4:] if progress.stage_of(n) == "vela"][1:]:
        progress.mark(name, "running")
    console.print(progress.table())
    wider = console.export_text()
    assert {len(ln) for ln in wider.splitlines()[1:] if ln.strip()} == widths and "ds_cnn-ethos" in wider


def test_the_eta_comes_from_this_runs_own_figures_and_the_chains_left(project: Path, monkeypatch):
    """The ETA ran high early (38-41 s for a 13 s build): from the first finished task on, every stage not
    seen yet was taken at the mean of the seen ones (a report task like a TOSA check; an import, mostly
    start-up, for all of them). Now there is none until every stage with work left has a time of its own,
    and then the work left spread over the parallel tasks or the longest chain left, whichever is longer."""
    from npubuild.engine import progress as progress_module

    plan = make_plan(load_specs([project / "configs"]), project / "build", STAGES)
    clock = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    p = StageProgress(plan)
    by_stage: dict[str, list[str]] = {}
    for name, task in plan.tasks.items():
        by_stage.setdefault(task.stage, []).append(name)

    def run(stage: str, seconds: float, i: int = 0) -> None:
        name = by_stage[stage][i]
        p.mark(name, "running")
        clock[0] += seconds
        p.mark(name, "ran")

    for stage, seconds in (("import", 1.0), ("early-fit", 0.1), ("quantize", 2.0), ("lower", 3.2),
                           ("tosa-check", 7.2)):
        run(stage, seconds)
        assert p.eta() is None  # Vela and the report not timed yet: no guess
    run("vela", 0.5)
    run("npu-sim", 0.1)
    assert p.eta() is None
    run("report", 0.01)
    assert p.eta() == pytest.approx(2 * (0.5 + 0.1 + 0.01))  # two builds' Vela, npu-sim and report, one job
    p.mark(by_stage["vela"][1], "running")
    p.mark(by_stage["vela"][2], "running")  # two at once: the work left is spread over both ...
    clock[0] += 0.2
    work = (0.3 + 0.3 + 2 * 0.1 + 2 * 0.01) / 2
    assert p.eta() == pytest.approx(max(work, 0.3 + 0.1 + 0.01))  # ... or the chain vela -> npu-sim -> report
