"""Which Ethos-U configuration does a model need? `npubuild advise` builds it for every shipped profile
(U55-32..256, U65-256/512, U85-128..2048) at a sweep of SRAM sizes, through the same plan, session and cache
as `npubuild build`, and answers with each configuration's time, memory, energy proxy and MAC efficiency,
the Pareto front of time against hardware size, and the smallest configuration that meets a latency budget.

A configuration is a target profile with its SRAM pool resized: on a U55 that is the system SRAM holding the
tensor arena (too small: the build does not fit); on a U65/U85 the NPU's dedicated SRAM cache in front of
DRAM (smaller: slower). Vela's arena cache is the SRAM pool's size (ethosu/vela_ini.py), so every size is a
real Vela compile, not a scaled estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from npubuild.config.accelerator import Accelerator
from npubuild.config.load import Build, default_search_path, find_project_root, load_target, lowering_families
from npubuild.config.schema import TargetProfile
from npubuild.errors import InputError, Location

# The shipped profiles, smallest first. A project's own profile of the same name is used instead, as
# everywhere in npubuild (its board's clock and memories).
PROFILES = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512",
            "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048")
SWEEP_KIB = (32, 64, 128, 256, 512, 1024, 2048)  # SRAM sizes tried on every profile, beside the profile's own
MAX_SIZES = 12  # bounds on what the flags may ask for: sizes per sweep, configurations, each size
MAX_CONFIGS = 200
SRAM_RANGE_KIB = (4, 65536)
GENERATION_RANK = {"u55": 0, "u65": 1, "u85": 2}  # a smaller system first when MACs and SRAM are equal
# Stages the sweep leaves out: they check the deployed artifact of one configuration (the virtual device, the
# FVP), not what picking one needs, and npu-sim on every configuration more than doubled a cold DS-CNN sweep
# (84 configurations: 36 -> 83 s at load 20). `npubuild build` of the chosen target runs them.
LEFT_OUT = ("npu-sim", "fvp")


def advise_stages() -> tuple:
    """The stages each configuration goes through: npubuild's, less LEFT_OUT."""
    from npubuild.stages import STAGES

    return tuple(s for s in STAGES if s.name not in LEFT_OUT)


@dataclass(frozen=True)
class Config:
    """One hardware configuration to try: a profile with its SRAM pool at `sram_kib`."""

    profile: str
    sram_kib: float
    target: TargetProfile

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator.parse(self.target.accelerator)


def sram_pool(profile: TargetProfile) -> str:
    """The profile's SRAM pool: the one Vela's arena cache lives in (placement.cache), of kind sram."""
    name = profile.placement.cache
    if profile.pools[name].kind != "sram":
        raise InputError(f"target '{profile.name}': its cache pool '{name}' is not SRAM: nothing to sweep")
    return name


def resized(profile: TargetProfile, kib: float) -> TargetProfile:
    """`profile` with its SRAM pool (and so Vela's arena cache) at `kib`; named `<profile>-sram<kib>` unless it
    is the profile's own size (then the profile itself: its builds share tasks with ordinary builds)."""
    pool = sram_pool(profile)
    if profile.pools[pool].size_kib == kib and profile.placement.arena_cache_kib is None:
        return profile
    pools = {**profile.pools, pool: profile.pools[pool].model_copy(update={"size_kib": kib})}
    return profile.model_copy(update={
        "name": f"{profile.name}-sram{kib:g}", "pools": pools, "mirrors": None,
        "placement": profile.placement.model_copy(update={"arena_cache_kib": None}),
        "description": f"{profile.name} with {kib:g} KiB of SRAM (npubuild advise)"})


def configurations(profiles: list[TargetProfile], sizes: tuple[float, ...]) -> list[Config]:
    """Every profile at each size of the sweep and at its own SRAM size, smallest hardware first."""
    out: dict[str, Config] = {}
    for p in profiles:
        own = p.pools[sram_pool(p)].size_kib
        for kib in sorted({*sizes, own}):
            t = resized(p, kib)
            out.setdefault(t.name, Config(p.name, kib, t))
    configs = sorted(out.values(), key=cost_key)
    if len(configs) > MAX_CONFIGS:
        raise InputError(f"{len(configs)} configurations (at most {MAX_CONFIGS}): fewer --targets or --sram sizes")
    return configs


def cost_key(c) -> tuple:
    """How small a configuration is: MACs per cycle, then SRAM, then the smaller system (U55 < U65 < U85)."""
    return (c.accelerator.macs, c.sram_kib, GENERATION_RANK[c.accelerator.generation], c.name)


def parse_sizes(text: str | None) -> tuple[float, ...]:
    """`--sram 128,256,512` (KiB): bounded in count and size, or the default sweep."""
    if text is None:
        return SWEEP_KIB
    try:
        sizes = tuple(sorted({float(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise InputError(f"--sram '{text}': sizes in KiB separated by commas, e.g. 128,256,512") from None
    if not sizes or len(sizes) > MAX_SIZES:
        raise InputError(f"--sram: 1 to {MAX_SIZES} sizes, got {len(sizes)}")
    low, high = SRAM_RANGE_KIB
    bad = [s for s in sizes if not low <= s <= high]
    if bad:
        raise InputError(f"--sram {bad[0]:g}: sizes from {low} to {high} KiB")
    return sizes


def load_profiles(names: list[str], root: Path) -> list[TargetProfile]:
    """The named profiles, found as a spec would find them (the project's targets/, then the shipped ones)."""
    search = default_search_path(root)
    return [load_target(n, search, Location("<command line>"))[0] for n in names]


def advisor_builds(template: list[Build], configs: list[Config]) -> list[Build]:
    """The template build (the model with its spec's quantisation, calibration, pipeline and checks) once per
    configuration; its lower stage lowers every family the configurations need, once."""
    from npubuild.config.load import vela_options

    families = lowering_families([c.target for c in configs])
    b = template[0]
    return [dataclasses.replace(b, target=c.target, vela=vela_options(c.target.vela, b.spec.vela),
                                spec_families=families) for c in configs]


def template_builds(source: Path, model: str | None) -> list[Build]:
    """The build to repeat per configuration: from a spec (its one model, or `model`) or an ONNX file (the
    defaults `npubuild compile` uses)."""
    from npubuild.config.load import adhoc_builds, load_spec

    if source.suffix == ".onnx":
        return adhoc_builds(source, [PROFILES[0]], project_root=find_project_root(source.parent))
    if source.suffix not in (".yaml", ".yml"):
        raise InputError("not an ONNX model (.onnx) or a compile spec (.yaml)", str(source))
    builds = load_spec(source)
    names = sorted({b.model_name for b in builds})
    if model is None and len(names) > 1:
        raise InputError(f"the spec has {len(names)} models ({', '.join(names)}): choose one with --model", str(source))
    chosen = [b for b in builds if model is None or b.model_name == model]
    if not chosen:
        from npubuild.suggest import did_you_mean

        raise InputError(f"--model '{model}' is not in the spec{did_you_mean(model or '', names) or ''} "
                         f"(models: {', '.join(names)})", str(source))
    return chosen[:1]


@dataclass
class Point:
    """One configuration's answer. `fits`: Vela compiled it and every pool holds what it needs."""

    config: str
    profile: str
    accelerator: str
    generation: str
    macs_per_cycle: int
    sram_kib: float
    clock_mhz: float
    status: str
    fits: bool  # compiled, every pool holds what it needs
    cause: str | None
    misfit: bool = False  # not compiled because a pool is too small (else `cause` is another failure)
    inference_ms: float | None = None
    inferences_per_s: float | None = None
    sram_used_kib: float | None = None
    offchip_kib: float | None = None
    npu_cycles: int | None = None
    model_macs: int | None = None
    energy_proxy: float | None = None  # NPU cycles x MACs per cycle: the MAC array's size times how long it runs
    efficiency: float | None = None  # the model's MACs over the MAC array's cycles x size (MAC utilisation)
    pareto: bool = False
    meets_budget: bool | None = None  # None: no budget asked
    misfit_key: str | None = None  # a pool that did not fit: the Vela task's full key (config + input contents)
    reused_from: str | None = None  # that misfit taken from this earlier run: same key, so the same answer


def point(c: Config, entry: dict | None) -> Point:
    from npubuild.report.brief import failure_cause

    acc = c.accelerator
    p = Point(c.name, c.profile, acc.name, acc.generation, acc.macs, c.sram_kib, c.target.clock_mhz,
              (entry or {}).get("status", "missing"), False, None, reused_from=(entry or {}).get("reused_from"))
    if entry is None:
        p.cause = "not built"
        return p
    m = entry.get("metrics") or {}
    vela = (entry.get("stages") or {}).get("vela", {})
    p.fits = vela.get("status") == "passed"
    p.cause = None if p.fits else (failure_cause(entry) or "not compiled")
    p.misfit = is_misfit(entry)
    if not p.fits:
        return p
    ms, cycles, macs = m.get("inference_ms"), m.get("npu_cycles"), m.get("macs")
    p.inference_ms = ms
    p.inferences_per_s = 1000.0 / ms if ms else None
    p.sram_used_kib, p.offchip_kib, p.npu_cycles, p.model_macs = m.get("sram_kib"), m.get("offchip_kib"), cycles, macs
    if cycles:
        p.energy_proxy = float(cycles) * acc.macs
        p.efficiency = round(macs / (cycles * acc.macs), 4) if macs else None
    return p


def pareto_front(points: list[Point]) -> list[Point]:
    """The configurations no other beats on time, MACs per cycle and SRAM at once (fitting ones only)."""
    fit = [p for p in points if p.fits and p.inference_ms is not None]

    def dominates(a: Point, b: Point) -> bool:
        ka = (a.inference_ms, a.macs_per_cycle, a.sram_kib)
        kb = (b.inference_ms, b.macs_per_cycle, b.sram_kib)
        return all(x <= y for x, y in zip(ka, kb, strict=True)) and ka != kb

    return [p for p in fit if not any(dominates(q, p) for q in fit)]


def budget_ms(latency_ms: float | None, fps: float | None) -> float | None:
    """The time one inference may take: the tighter of --latency-ms and 1000 / --fps."""
    for name, v in (("--latency-ms", latency_ms), ("--fps", fps)):
        if v is not None and not v > 0:
            raise InputError(f"{name} must be above 0, got {v:g}")
    limits = [v for v in (latency_ms, 1000.0 / fps if fps else None) if v is not None]
    return min(limits) if limits else None


def choose(points: list[Point], budget: float | None) -> Point | None:
    """The smallest configuration (cost_key's order) that fits and runs within `budget` ms; with no budget,
    None. Marks each point's `meets_budget`."""
    if budget is None:
        return None
    for p in points:
        p.meets_budget = bool(p.fits and p.inference_ms is not None and p.inference_ms <= budget)
    meeting = [p for p in points if p.meets_budget]
    return min(meeting, key=lambda p: (p.macs_per_cycle, p.sram_kib, GENERATION_RANK[p.generation],
                                       p.inference_ms, p.config)) if meeting else None


def vela_key(plan, build: Build) -> str | None:
    """The content key of a build's Vela task (its config and the contents of its inputs, as the shared cache
    keys it), or None while its inputs are not there."""
    from npubuild.engine.cache import cache_key

    task = plan.tasks[plan.build_tasks[build.id]["vela"]]
    try:
        return cache_key(task.config, task.inputs)
    except OSError:
        return None


def is_misfit(entry: dict) -> bool:
    """A build whose only failure is a pool that does not fit (errors.PoolsTooSmall's pools in its entry)."""
    pools = (entry.get("metrics") or {}).get("pools") or []
    failed = [k for k, s in (entry.get("stages") or {}).items() if s.get("status") == "failed"]
    return failed == ["vela"] and any(not p.get("fits", True) for p in pools)


def known_misfits(previous: dict | None) -> dict[str, tuple[str, dict]]:
    """From the previous advise report in the same place: each configuration that did not fit, with its Vela
    task's key then and its report entry. A rerun with the same key would only fail the same way (Vela's
    output is a function of its inputs), so advise takes the answer instead of compiling it again: a misfit is
    never cached as a task (a failed task reruns), and a sweep has dozens."""
    if not isinstance(previous, dict) or not isinstance(previous.get("advice"), dict):
        return {}
    entries = {b.get("target"): b for b in previous.get("builds", []) if isinstance(b, dict)}
    out = {}
    for p in previous["advice"].get("configurations", []):
        entry = entries.get(p.get("config"))
        if p.get("misfit_key") and entry is not None and is_misfit(entry):
            out[p["config"]] = (p["misfit_key"], {**entry, "reused_from": entry.get("reused_from")
                                                  or previous.get("run_id")})
    return out


@dataclass
class Advice:
    model: str
    budget_ms: float | None
    points: list[Point]
    chosen: Point | None

    def as_json(self) -> dict:
        front = [p.config for p in self.points if p.pareto]
        return {"model": self.model, "budget_ms": self.budget_ms, "chosen": self.chosen.config if self.chosen else None,
                "pareto": front, "configurations": [dataclasses.asdict(p) for p in self.points],
                "energy_proxy": "NPU cycles x MACs per cycle", "efficiency": "model MACs / (NPU cycles x MACs per cycle)"}


def analyse(model: str, configs: list[Config], entries: dict[str, dict], budget: float | None,
            misfit_keys: dict[str, str | None] | None = None) -> Advice:
    points = [point(c, entries.get(c.name)) for c in configs]
    for p in points:
        p.misfit_key = (misfit_keys or {}).get(p.config)
    for p in pareto_front(points):
        p.pareto = True
    return Advice(model, budget, points, choose(points, budget))
