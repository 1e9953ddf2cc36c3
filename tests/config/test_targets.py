"""Target profiles: every Vela accelerator has one, the .ini we write is complete, Vela never uses defaults."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

from npbtest import REPO, run_cli

from npubuild.config.load import default_search_path, load_target
from npubuild.config.schema import ACCELERATORS
from npubuild.errors import Location
from npubuild.ethosu.vela_ini import MEMORY_MODE, render_ini, system_config_name


def test_a_profile_for_every_accelerator_vela_accepts():
    search = default_search_path(REPO)
    names = search.names("targets")
    assert set(ACCELERATORS) <= set(names)
    for name in ACCELERATORS:
        profile, _ = load_target(name, search, Location(name))
        assert profile.accelerator == name
        ini = configparser.ConfigParser()
        ini.read_string(render_ini(profile))
        system = ini[f"System_Config.{system_config_name(profile.accelerator)}"]
        assert float(system["core_clock"]) == profile.clock_mhz * 1e6
        assert {system["axi0_port"], system["axi1_port"]} <= {"Sram", "Dram", "OnChipFlash", "OffChipFlash"}
        for pool in profile.pools.values():
            mem = system[f"{pool.port}_port"]
            for field in ("clock_scale", "burst_length", "read_latency", "write_latency"):
                assert f"{mem}_{field}".lower() in system
        mode = ini[f"Memory_Mode.{MEMORY_MODE}"]
        assert mode["const_mem_area"] in ("Axi0", "Axi1") and int(mode["arena_cache_size"]) > 0


def test_vela_is_always_given_our_config(project: Path, capsys):
    build_dir = project / "build"
    assert run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)[0] == 0
    logs = list((build_dir / "stages" / "vela").glob("*/*vela.log"))  # vela.log, or <family>_model.vela.log
    assert len(logs) == 3
    for log in logs:
        text = log.read_text()
        assert "Using a default" not in text and "No configuration file" not in text
        assert "_npubuild" in text and "npubuild_memory" in text


def test_targets_command_lists_clock_pools_and_placement(capsys):
    code, out, _ = run_cli(["targets"], capsys, cwd=REPO)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("ethos-u65-256 "))
    assert "1000 MHz" in line and "sram=sram/384KiB@axi0" in line and "dram=dram/65536KiB@axi1" in line
    assert "placement: constants=dram arena=dram cache=sram (Dedicated_Sram)" in out


def test_schema_command_prints_json_schema(capsys):
    code, out, _ = run_cli(["schema"], capsys)
    schema = json.loads(out)
    assert code == 0
    spec, extending = schema["$defs"]["CompileSpec"], schema["$defs"]["CompileSpecExtending"]
    assert {"models", "targets", "pipeline", "expect"} <= set(spec["properties"])
    assert spec["additionalProperties"] is False and "extends" in extending["properties"]
    assert [b["$ref"] for b in schema["anyOf"]] == ["#/$defs/CompileSpec", "#/$defs/CompileSpecExtending"]


def test_spec_can_override_a_profiles_pool_inline(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace(
        "targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]",
        "targets:\n  - {extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 1}}}"))
    code, _, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert "pool 'sram'" in line and "has 1.0 KiB" in line and "needs" in line
