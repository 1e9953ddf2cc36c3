"""`npubuild advise`: the smallest configuration within a budget, the Pareto front, and the sweep it is chosen
from (a real sweep of the DS-CNN over two profiles and three SRAM sizes, then the choice rules alone)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from npbtest import REPO, run_cli

from npubuild.advise import GENERATION_RANK, Point, budget_ms, choose, pareto_front, parse_sizes
from npubuild.errors import InputError


def _point(name: str, macs: int, sram: float, ms: float | None, gen: str = "u55", fits: bool = True) -> Point:
    return Point(name, name.split("-sram")[0], f"ethos-{gen}-{macs}", gen, macs, sram, 500.0,
                 "passed" if fits else "failed", fits, None if fits else "pool 'sram' needs more", misfit=not fits,
                 inference_ms=ms)


def test_the_smallest_configuration_within_the_budget_is_chosen():
    points = [_point("ethos-u55-64-sram32", 64, 32, None, fits=False),  # the smallest, but it does not fit
              _point("ethos-u55-64", 64, 2048, 0.9),  # fits, too slow
              _point("ethos-u55-128-sram256", 128, 256, 0.4),
              _point("ethos-u85-128-sram256", 128, 256, 0.2, "u85"),  # faster, but a bigger system at equal size
              _point("ethos-u55-128-sram128", 128, 128, 0.45),  # the smallest that is fast enough
              _point("ethos-u85-2048", 2048, 384, 0.02, "u85")]
    assert choose(points, 0.5).config == "ethos-u55-128-sram128"
    assert [p.meets_budget for p in points] == [False, False, True, True, True, True]
    assert choose(points, 0.42).config == "ethos-u55-128-sram256"  # 128 KiB is now too slow
    assert choose(points, 0.3).config == "ethos-u85-128-sram256"
    assert GENERATION_RANK["u55"] < GENERATION_RANK["u85"]
    assert choose(points, 0.01) is None and not any(p.meets_budget for p in points)
    assert choose(points, None) is None
    front = {p.config for p in pareto_front(points)}
    assert front == {"ethos-u55-64", "ethos-u55-128-sram128", "ethos-u55-128-sram256", "ethos-u85-128-sram256",
                     "ethos-u85-2048"} - {"ethos-u55-128-sram256"}  # beaten by the U85-128 at the same size
    assert budget_ms(2.0, None) == 2.0 and budget_ms(None, 50) == 20.0 and budget_ms(25.0, 50) == 20.0
    assert budget_ms(None, None) is None


@pytest.mark.parametrize("text, problem", [("0,128", "sizes from 4 to 65536 KiB"), ("128,abc", "sizes in KiB"),
                                           (",".join(str(16 * i) for i in range(1, 14)), "1 to 12 sizes")])
def test_the_sweep_asked_for_is_bounded(text: str, problem: str):
    with pytest.raises(InputError, match=problem):
        parse_sizes(text)


def test_advise_sweeps_the_dscnn_and_names_the_smallest_configuration_within_the_budget(tmp_path: Path, capsys):
    project = tmp_path / "product"
    project.mkdir()
    (project / "dodo.py").write_text("# product repo marker\n")
    model = REPO / "configs" / "models" / "ds_cnn.onnx"
    args = ["advise", str(model), "--targets", "ethos-u55-64,ethos-u85-128", "--sram", "4,512", "-n", "2"]
    code, out, err = run_cli([*args, "--latency-ms", "0.2"], capsys, cwd=project)
    assert code == 0, out + err
    out_dir = project / "build" / "advise" / "ds_cnn"
    report = json.loads((out_dir / "report.json").read_text())
    advice = report["advice"]
    points = {p["config"]: p for p in advice["configurations"]}
    # two profiles at 4 KiB, 512 KiB and their own size: each a real Vela compile, in report.json's builds too
    assert set(points) == {"ethos-u55-64-sram4", "ethos-u55-64-sram512", "ethos-u55-64", "ethos-u85-128-sram4",
                           "ethos-u85-128-sram512", "ethos-u85-128"}
    assert {b["target"] for b in report["builds"]} == set(points)
    misfit = points["ethos-u55-64-sram4"]  # the arena does not fit 4 KiB of shared SRAM
    assert not misfit["fits"] and "pool 'sram'" in misfit["cause"] and misfit["inference_ms"] is None
    meeting = [p for p in points.values() if p["fits"] and p["inference_ms"] <= 0.2]
    smallest = min(meeting, key=lambda p: (p["macs_per_cycle"], p["sram_kib"], GENERATION_RANK[p["generation"]]))
    assert advice["chosen"] == smallest["config"] and advice["budget_ms"] == 0.2
    assert all(p["meets_budget"] == (p in meeting) for p in points.values())
    fitting = [p for p in points.values() if p["fits"]]
    assert all(p["energy_proxy"] == p["npu_cycles"] * p["macs_per_cycle"] for p in fitting)
    assert all(0 < p["efficiency"] <= 1 for p in fitting)
    assert advice["pareto"] and all(points[c]["fits"] for c in advice["pareto"])
    assert f"smallest configuration within 0.2 ms: {smallest['config']} " in out
    assert next(ln for ln in out.splitlines() if ln.startswith(smallest["config"] + " ")).endswith(
        "<< SMALLEST WITHIN BUDGET")
    assert (out_dir / "advice.png").read_bytes().startswith(b"\x89PNG")
    page = (out_dir / "advice.html").read_text()
    assert f'<tr class="chosen"><td>{smallest["config"]}</td>' in page and "data:image/png;base64," in page
    # the same sweep again comes from the build dir: nothing runs, not even Vela for the misfit (its inputs are
    # the same, so is the answer); a budget nothing meets is exit 1
    code, out, err = run_cli([*args, "--fps", "1000000"], capsys, cwd=project)
    assert code == 1 and "no configuration meets 0.001 ms" in out
    # (its five others' early-fit check and report entries run again: the early-fit task's key holds the
    # targets of the builds sharing it, one fewer now; no Vela, no stage before it)
    assert re.match(r"6 ran, \d+ cached, 0 failed", out.splitlines()[-1]) and ", 1 known not to fit (the same Vela" in out
    again = json.loads((out_dir / "report.json").read_text())
    reused = next(p for p in again["advice"]["configurations"] if p["config"] == "ethos-u55-64-sram4")
    assert reused["reused_from"] == report["run_id"] and not reused["fits"] and reused["misfit_key"]
    # a misfit whose Vela inputs are not those of then is compiled again
    again["advice"]["configurations"] = [dict(p, misfit_key="0" * 40) for p in again["advice"]["configurations"]]
    (out_dir / "report.json").write_text(json.dumps(again))
    code, out, err = run_cli([*args, "--latency-ms", "0.2"], capsys, cwd=project)
    assert code == 0 and "known not to fit" not in out and ", 1 failed, " in out.splitlines()[-1], out


def test_a_model_no_configuration_can_take_is_one_line_exit_2(tmp_path: Path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    code, out, err = run_cli(["advise", str(bad), "--targets", "ethos-u55-128", "--sram", "64",
                              "--build-dir", str(tmp_path / "build")], capsys)
    assert code == 2 and not out and err.strip() == f"{bad}: error: not an ONNX model (DecodeError)"
    code, _, err = run_cli(["advise", str(bad), "--sram", "1,2"], capsys)
    assert code == 2 and err.strip() == "error: --sram 1: sizes from 4 to 65536 KiB"
    code, _, err = run_cli(["advise", str(bad), "-n", "100000"], capsys)
    assert code == 2 and "-n/--jobs must be from 1 to" in err
