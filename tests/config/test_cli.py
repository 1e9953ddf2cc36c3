"""Command-line conventions: --version, help with defaults, exit codes and environment in --help, "did you
mean" for a mistyped subcommand, --debug after the subcommand, `npubuild ops`, and the JSON Schemas
accepting every spec, target and pipeline file the loader accepts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from npbtest import REPO, run_cli

import npubuild
from npubuild.cli import make_parser
from npubuild.config.schema import json_schema


def test_version_and_help_carry_exit_codes_environment_and_defaults(capsys):
    with pytest.raises(SystemExit) as stop:
        make_parser().parse_args(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"npubuild {npubuild.__version__}"
    text = make_parser().format_help()
    for needle in ("exit codes:", "  2  bad input", "NPUBUILD_CACHE", "NPUBUILD_WAIT", "DOIT_SEEK_FILE"):
        assert needle in text
    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():  # every option of every command says what it does and its default
        help_text = " ".join(sp.format_help().split())
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"npubuild {name} {action.option_strings or action.dest}: no help"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in action.help or f"(default: {action.default})" in help_text, (
                    name, action.option_strings)
    assert "(default: 1)" in sub.choices["build"].format_help()  # -n/--jobs


def test_mistyped_subcommand_suggests_the_right_one_and_debug_after_it_is_accepted(project: Path, capsys):
    code, _, err = run_cli(["biuld"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1 and "did you mean 'build'?" in err
    code, out, err = run_cli(["validate", "--debug"], capsys, cwd=project)  # after the subcommand
    assert code == 0 and out.startswith("ok: 1 spec(s)"), err
    code, _, err = run_cli(["build", "--jobs", "0", "--debug"], capsys, cwd=project)  # the traceback, as asked
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].endswith("-n/--jobs must be at least 1, got 0")
    code, _, err = run_cli(["--debug", "build", "--no-such-option"], capsys, cwd=project)  # a usage error
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_ops_lists_every_lowered_op_and_where_it_runs_per_family(capsys, tmp_path: Path, monkeypatch):
    from npubuild.lowering.registry import supported_op_types

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # computed here, not read from the user's cache
    code, out, _ = run_cli(["ops", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert {r["op"] for r in rows} == set(supported_op_types())
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    by = {r["label"]: r for r in rows}
    for op in ("Greater", "Where"):  # GREATER and SELECT: Ethos-U85 runs them, U55/U65 do not
        fams = by[op]["families"]
        assert fams["u55"]["where"] == fams["u65"]["where"] == "cpu" and fams["u55"]["rule"] == "u55-op-type"
        assert fams["u85"]["where"] == fams["u85wide"]["where"] == "npu"
    assert all(f["where"] == "npu" and "CONV2D" in f["tosa_ops"] for f in by["Conv"]["families"].values())
    assert any(c.startswith("u55-resize:") for c in by["Resize (nearest 2x)"]["conditions"])
    assert by["Relu"]["families"]["u55"]["where"] == "fused"
    assert "absorbed" in by["QuantizeLinear"]["note"]
    for label in ("com.microsoft:Gelu", "com.microsoft:FastGelu (bias)", "com.microsoft:BiasGelu",
                  "com.microsoft:QuickGelu"):  # onnxruntime's fused contrib ops: a TABLE on the NPU everywhere
        assert all(f["where"] == "npu" and "TABLE" in f["tosa_ops"] for f in by[label]["families"].values()), label
    # the table is kept, keyed by npubuild's source and the tools' versions: the text comes from it, whole
    kept = list((tmp_path / "npubuild").glob("ops-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == [
        {k: v for k, v in r.items() if k != "conditions"} for r in rows]
    code, out, _ = run_cli(["ops"], capsys)
    greater = next(ln for ln in out.splitlines() if ln.startswith("Greater "))
    assert greater.split()[1:5] == ["CPU", "CPU", "NPU", "NPU"] and "u55-op-type: TOSA GREATER" in greater
    lines = {ln.split("  ")[0]: ln for ln in out.splitlines()}
    for r in rows:  # nothing cut in a pipe: every TOSA op and note of every row is in its line
        line = lines[r["label"]]
        assert ", ".join(r.get("families", {}).get("u55", {}).get("tosa_ops", [])) in line
        assert all(c in line for c in r["conditions"]) and "\u2026" not in line
    kept[0].write_text("[{]")  # a damaged table is computed again, not read
    assert run_cli(["ops", "--json"], capsys)[0] == 0 and json.loads(kept[0].read_text())[0]["op"]


def _yaml(path: Path):
    return yaml.safe_load(path.read_text())


def test_schemas_accept_every_spec_target_and_pipeline_the_loader_accepts(project: Path, capsys):
    spec_schema, target_schema, pipe_schema = (json_schema(k) for k in ("spec", "target", "pipeline"))
    for schema in (spec_schema, target_schema, pipe_schema):
        jsonschema.Draft202012Validator.check_schema(schema)
    specs = sorted((REPO / "configs").glob("*.yaml"))
    assert len(specs) >= 8
    # the README's inline target extending a named one, and a spec extending another file
    readme = project / "configs" / "readme.yaml"
    readme.write_text((project / "configs" / "kws.yaml").read_text().replace("name: kws", "name: readme").replace(
        "targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]",
        "targets: [{extends: ethos-u55-128, name: u55-small, pools: {sram: {size_kib: 256}}}]"))
    child = project / "configs" / "child.yaml"
    child.write_text("extends: kws.yaml\nname: child\nexpect: {max_sram_kib: 384}\n")
    assert run_cli(["validate", str(readme), str(child)], capsys, cwd=project)[0] == 0
    for path in [*specs, readme, child]:
        jsonschema.validate(_yaml(path), spec_schema)
    for path in [*(REPO / "targets").glob("*.yaml"), *(REPO / "targets" / "base").glob("*.yaml")]:
        jsonschema.validate(_yaml(path), target_schema)
    for path in (REPO / "pipelines").glob("*.yaml"):
        jsonschema.validate(_yaml(path), pipe_schema)
    # still a schema: unknown keys and wrong types are rejected, as the loader rejects them
    bad = _yaml(specs[0]) | {"expct": {}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, spec_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"extends": "ethos-u55-128", "clock_mhz": "fast"}, target_schema)


def test_example_specs_point_at_the_schema_a_build_writes(project: Path, capsys):
    for spec in sorted((REPO / "configs").glob("*.yaml")):
        assert "yaml-language-server: $schema=../build/schema.json" in spec.read_text(), spec.name
    assert run_cli(["build", "-q", "--only", "ethos-u85-*"], capsys, cwd=project)[0] == 0
    written = json.loads((project / "build" / "schema.json").read_text())
    assert written == json_schema("spec")
    assert json.loads((project / "build" / "target.schema.json").read_text()) == json_schema("target")


def test_validate_rejects_input_shapes_naming_an_input_the_model_lacks(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("input_shapes: {input: [1, 1, 49, 10]}",
                                             "input_shapes: {inptu: [1, 1, 49, 10]}"))
    code, out, err = run_cli(["validate"], capsys, cwd=project / "configs")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"{spec}:9:") and "input_shapes names 'inptu', but the model's inputs are ['input']" in err
