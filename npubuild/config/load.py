"""Load specs, target profiles and pipelines from YAML into validated models.

Resolution rules, in one place:
- `extends:` names a parent file (a path ending in .yaml, relative to the file)
  or, for targets and pipelines, a profile name looked up on the search path;
  parents deep-merge under the child (later wins).
- A name in `targets:` / `pipeline:` is looked up as `<dir>/targets/<name>.yaml`
  (or pipelines/) over the search path: the spec's own `search_paths`, then the
  project root, then the profiles shipped with npubuild.
- Every path a config names must stay inside the project root, after symlinks
  are resolved: model, calibration and evaluation files, search paths, the FVP
  runner, and every file `extends:` pulls in (a spec's, a profile's, an inline
  target's). A profile shipped with npubuild stays inside npubuild's own tree.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from npubuild.config.accelerator import Accelerator
from npubuild.config.metrics import DEFAULT_GATES
from npubuild.config.schema import NAME_RE, CompileSpec, Pipeline, TargetProfile, VelaOptions
from npubuild.config.yamlfile import KEY, KeyPath, Marks, deep_merge, load_yaml, locate
from npubuild.errors import InputError, Location
from npubuild.suggest import allowed_keys, did_you_mean

SHIPPED_DATA = "_shipped"  # npubuild/_shipped/{targets,pipelines} in a wheel (setup.py's build_py copies them)


def shipped_root() -> Path:
    """The directory holding the shipped targets/ and pipelines/.

    The design keeps them at the repository's top level; a wheel carries them as package data under
    npubuild/_shipped (found with importlib.resources), a checkout or editable install reads the repository.
    """
    packaged = Path(str(importlib.resources.files("npubuild"))) / SHIPPED_DATA
    if (packaged / "targets").is_dir():
        return packaged
    return Path(__file__).resolve().parents[2]


SHIPPED_ROOT = shipped_root()
ROOT_MARKERS = ("dodo.py", "pyproject.toml", ".git", "npubuild.yaml")
M = TypeVar("M", bound=BaseModel)


def find_project_root(start: Path) -> Path:
    """The nearest ancestor holding a dodo.py, pyproject.toml or .git: config paths must stay below it."""
    start = start.resolve()
    for d in [start, *start.parents]:
        if any((d / m).exists() for m in ROOT_MARKERS):
            return d
    return start


def project_dir() -> Path:
    """The project the command runs in: found by walking up from the current directory (as git, cargo and
    doit do), so `cd configs && npubuild build` builds the whole project; the cwd itself outside any project."""
    return find_project_root(Path.cwd())


def default_build_dir(value: str | None) -> Path:
    """--build-dir as given (relative to the cwd), else the project's build/."""
    return Path(value) if value else project_dir() / "build"


def inside(path: Path, root: Path, what: str, where: Location) -> Path:
    """Resolve `path` and refuse it if it leaves `root` (no `../../etc/passwd` in a spec)."""
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise InputError(f"{what} '{path}' is outside the project directory {root}", where)
    return resolved


def validate(model: type[M], data: Any, marks: Marks, file: Path) -> M:
    """Validate with pydantic; the first error becomes one `file:line:col: error:` line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc: KeyPath = tuple(err["loc"])
        clean = _data_path(data, loc)
        where = locate(marks, clean, Location(str(file), 1, 1))
        field = ".".join(str(p) for p in clean) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            where = marks.get((*clean, KEY), where)
            key = str(clean[-1] if clean else loc[-1])
            msg = f"unknown key '{key}'" + (did_you_mean(key, allowed_keys(model, loc[:-1])) or "")
            field = ".".join(str(p) for p in clean[:-1]) or "(top level)"
        elif err["type"] == "missing":
            msg = f"missing required key '{loc[-1]}'"
            field = ".".join(str(p) for p in clean[:-1]) or "(top level)"
        raise InputError(f"{field}: {msg}", where) from None


def _data_path(data: Any, loc: KeyPath) -> KeyPath:
    """Keep the parts of a pydantic error path that exist in the data.

    pydantic inserts union-branch tags (e.g. 'TargetProfile') into error paths;
    they name no YAML node, so drop them. A final key that is absent (missing
    or unknown key) is kept.
    """
    out: list[str | int] = []
    node = data
    for i, p in enumerate(loc):
        if isinstance(node, dict) and p in node:
            out.append(p)
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and p < len(node):
            out.append(p)
            node = node[p]
        elif i == len(loc) - 1 and isinstance(node, dict):
            out.append(p)
    return tuple(out)


@dataclass(frozen=True)
class SearchPath:
    """Directories holding `targets/` and `pipelines/`, first match wins; `roots` are the trees config files
    may come from (the project, npubuild's shipped profiles)."""

    dirs: tuple[Path, ...]
    roots: tuple[Path, ...] = ()

    def root_of(self, path: Path) -> Path:
        """The innermost root holding `path` (a file's own tree bounds what it may name)."""
        path = path.resolve()
        holding = [r for r in self.roots if r == path or r in path.parents]
        return max(holding, key=lambda r: len(r.parts)) if holding else path.parent

    def find(self, kind: str, name: str, exclude: Path | None = None, where: Location | None = None) -> Path | None:
        for d in self.dirs:
            candidate = (d / kind / f"{name}.yaml").resolve()
            if candidate.is_file() and candidate != exclude:
                inside(candidate, self.root_of(d), f"{kind[:-1]} '{name}'", where or Location(str(d / kind)))
                return candidate
        return None

    def names(self, kind: str) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for d in reversed(self.dirs):
            for f in sorted((d / kind).glob("*.yaml")):
                found[f.stem] = f.resolve()
        return dict(sorted(found.items()))


def default_search_path(project_root: Path, extra: Iterable[Path] = ()) -> SearchPath:
    dirs = [*extra, project_root, SHIPPED_ROOT]
    unique: list[Path] = []
    for d in dirs:
        d = d.resolve()
        if d not in unique:
            unique.append(d)
    return SearchPath(tuple(unique), (project_root.resolve(), SHIPPED_ROOT))


def load_with_extends(path: Path, kind: str | None, search: SearchPath, _seen: tuple[Path, ...] = ()) -> tuple[dict, Marks]:
    """Load a YAML mapping and merge its `extends:` chain under it."""
    path = path.resolve()
    if path in _seen:
        chain = " -> ".join(p.name for p in (*_seen, path))
        raise InputError(f"extends cycle: {chain}", path)
    data, marks = load_yaml(path)
    if not isinstance(data, dict):
        raise InputError("expected a mapping at the top level", marks.get((), Location(str(path), 1, 1)))
    return merge_extends(data, marks, path, kind, search, (*_seen, path))


def merge_extends(
    data: dict, marks: Marks, path: Path, kind: str | None, search: SearchPath, seen: tuple[Path, ...]
) -> tuple[dict, Marks]:
    parents = data.pop("extends", None)
    if parents is None:
        return data, marks
    where = marks.get(("extends",), Location(str(path)))
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise InputError("extends: expected a name or a list of names/paths", where)
    merged: dict = {}
    merged_marks: Marks = {}
    for parent in parents:
        parent_path = resolve_ref(parent, path, kind, search, where)
        pdata, pmarks = load_with_extends(parent_path, kind, search, seen)
        merged, merged_marks = deep_merge(merged, pdata, merged_marks, pmarks)
    own_marks = {p: loc for p, loc in marks.items() if p[:1] != ("extends",)}
    return deep_merge(merged, data, merged_marks, own_marks)


def resolve_ref(ref: str, from_file: Path, kind: str | None, search: SearchPath, where: Location) -> Path:
    """`extends` value: a .yaml path relative to the file, or a profile name on the search path."""
    if ref.endswith((".yaml", ".yml")):
        candidate = inside(from_file.parent / ref, search.root_of(from_file), "extends", where)
        if not candidate.is_file():
            raise InputError(f"extends: file '{ref}' not found", where)
        return candidate
    if kind is None:
        raise InputError(f"extends: '{ref}' must be a path ending in .yaml", where)
    found = search.find(kind, ref, exclude=from_file.resolve(), where=where)
    if found is None:
        raise InputError(f"extends: no {kind[:-1]} named '{ref}' on the search path", where)
    return found


def _load_named(model: type[M], kind: str, name: str, search: SearchPath, where: Location) -> tuple[M, Path]:
    """A target profile or pipeline by name: `<dir>/<kind>/<name>.yaml` on the search path, extends merged."""
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 80:
        raise InputError(f"'{str(name)[:80]}' is not a {kind[:-1]} name (letters, digits, '.', '_' and '-', "
                         f"starting with a letter or digit; `npubuild {kind}` lists them)", where)
    path = search.find(kind, name, where=where)
    if path is None:
        names = search.names(kind)
        hint = did_you_mean(name, names) or f" (known: {', '.join(names) or 'none'})"
        raise InputError(f"unknown {kind[:-1]} '{name}'{hint}", where)
    data, marks = load_with_extends(path, kind, search)
    data.setdefault("name", name)
    return validate(model, data, marks, path), path


def load_target(name: str, search: SearchPath, where: Location) -> tuple[TargetProfile, Path]:
    return _load_named(TargetProfile, "targets", name, search, where)


def load_pipeline(name: str, search: SearchPath, where: Location) -> tuple[Pipeline, Path]:
    return _load_named(Pipeline, "pipelines", name, search, where)


@dataclass(frozen=True)
class EvaluationFiles:
    """The files of a model's evaluation: its inputs, its labels (optional but for top1) and, for a user
    metric `module:function`, the module's file."""

    inputs: Path
    labels: Path | None = None
    metric_module: Path | None = None


@dataclass(frozen=True)
class Build:
    """One spec x model x target: everything the stages need, resolved and validated."""

    spec: CompileSpec
    spec_path: Path
    project_root: Path
    model_name: str
    model_path: Path
    calibration_npy: Path | None
    target: TargetProfile
    pipeline: Pipeline
    vela: VelaOptions
    evaluation: EvaluationFiles | None = None  # the model's evaluation set (`evaluate:`/`evaluation:`)
    fvp_runner: Path | None = None  # the spec's fvp.runner, resolved inside the project and present
    # the lowering families of every target of its spec: what its lower stage lowers, so that a command
    # planning this build alone (debug-numerics, offloads) shares the spec build's lower task
    spec_families: tuple[str, ...] = ()

    @property
    def optimise(self) -> str:
        """"performance" (the default) or "size": the spec's optimise, else its target profile's."""
        return self.spec.optimise or self.target.optimise or "performance"

    @property
    def id(self) -> str:
        return f"{self.spec.name}/{self.model_name}/{self.target.name}"

    @property
    def model(self):
        return self.spec.models[self.model_name]

    @property
    def evaluation_inputs(self) -> Path | None:
        """The model's evaluation inputs (`evaluate:` or `evaluation:`), held out by the spec's author."""
        return self.evaluation.inputs if self.evaluation is not None else None

    def _gate_layers(self) -> list[dict]:
        """The gates' sources, later wins: the profile's defaults, the pipeline's `expect:`, the spec's."""
        return [dict(DEFAULT_GATES.get(self.pipeline.profile, {})), _set_fields(self.pipeline.expect),
                _set_fields(self.spec.expect)]

    @property
    def expect(self) -> dict[str, object]:
        """The gates this build is held to: a key set in a later layer wins, `null` there turns it off."""
        out: dict[str, object] = {}
        for layer in self._gate_layers():
            out.update(layer)
        return {k: v for k, v in out.items() if v is not None}

    @property
    def default_gates(self) -> tuple[str, ...]:
        """The gates the spec did not set itself (a default one on a metric nobody measured is not evaluated)."""
        own = self.spec.expect.model_fields_set
        return tuple(sorted(k for k in self.expect if k not in own))


def _set_fields(model: BaseModel) -> dict[str, object]:
    """The fields a YAML file set, in the schema's order: a set's order changes from run to run (string hashing),
    and report.json lists the gates in this order."""
    return {k: getattr(model, k) for k in type(model).model_fields if k in model.model_fields_set}


def load_spec(path: Path) -> list[Build]:
    """Load one compile spec and expand it into its builds."""
    path = path.resolve()
    root = find_project_root(path.parent)
    data, marks = load_yaml(path)
    if not isinstance(data, dict):
        raise InputError("expected a mapping at the top level", Location(str(path), 1, 1))
    pre_search = _spec_search_path(data, marks, path, root)
    data, marks = merge_extends(data, marks, path, None, pre_search, (path,))
    search = _spec_search_path(data, marks, path, root)

    # Inline targets may extend a named profile: resolve those before validation.
    targets = data.get("targets")
    if isinstance(targets, list):
        for i, t in enumerate(targets):
            if isinstance(t, dict) and "extends" in t:
                sub = {p[2:]: loc for p, loc in marks.items() if p[:2] == ("targets", i)}
                merged, merged_marks = merge_extends(dict(t), sub, path, "targets", search, (path,))
                targets[i] = merged
                for p, loc in merged_marks.items():
                    marks[("targets", i, *p)] = loc
    spec = validate(CompileSpec, data, marks, path)

    if isinstance(spec.pipeline, str):
        pipeline, _ = load_pipeline(spec.pipeline, search, locate(marks, ("pipeline",), Location(str(path))))
    else:
        pipeline = spec.pipeline
    from npubuild.frontend.passes import check_pass_names

    check_pass_names(pipeline, locate(marks, ("pipeline",), Location(str(path))))

    profiles: list[TargetProfile] = []
    for i, t in enumerate(spec.targets):
        if isinstance(t, str):
            profile, _ = load_target(t, search, locate(marks, ("targets", i), Location(str(path))))
        else:
            profile = t
        profiles.append(profile)
    runner = None
    if spec.fvp.runner is not None:  # checked here so that `npubuild validate` names it with its position
        where = locate(marks, ("fvp", "runner"), Location(str(path)))
        runner = inside(path.parent / spec.fvp.runner, root, "fvp.runner", where)
        if not runner.is_file():
            raise InputError(f"fvp.runner '{spec.fvp.runner}' not found", where)

    families = lowering_families(profiles)
    builds = []
    for model_name, model in spec.models.items():
        where = locate(marks, ("models", model_name, "path"), Location(str(path)))
        model_path = inside(path.parent / model.path, root, "model path", where)
        if not model_path.is_file():
            raise InputError(f"model file '{model.path}' not found", where)
        npy = None
        if model.calibration.npy is not None:
            where = locate(marks, ("models", model_name, "calibration", "npy"), Location(str(path)))
            npy = inside(path.parent / model.calibration.npy, root, "calibration file", where)
            if not npy.is_file():
                raise InputError(f"calibration file '{model.calibration.npy}' not found", where)
        evaluation = _evaluation_files(model, model_name, path, root, marks)
        for profile in profiles:
            builds.append(
                Build(
                    spec=spec,
                    spec_path=path,
                    project_root=root,
                    model_name=model_name,
                    model_path=model_path,
                    calibration_npy=npy,
                    target=profile,
                    pipeline=pipeline,
                    vela=vela_options(profile.vela, spec.vela, spec.optimise or profile.optimise),
                    evaluation=evaluation,
                    fvp_runner=runner,
                    spec_families=families,
                )
            )
    return builds


def vela_options(target: VelaOptions, spec: VelaOptions | None, optimise: str | None = None) -> VelaOptions:
    """The target's Vela options with the fields the spec sets laid over them.

    Field by field, so a spec asking for one extra flag keeps what the target
    chose elsewhere (its output format, say). `optimise: size` (spec or profile) asks Vela for
    `--optimise Size` over the profile's Vela options, unless the spec's own `vela: {optimise: ...}` says otherwise.
    """
    opts = target if spec is None else target.model_copy(update={k: getattr(spec, k) for k in spec.model_fields_set})
    if optimise == "size" and not (spec is not None and "optimise" in spec.model_fields_set):
        opts = opts.model_copy(update={"optimise": "Size"})
    return opts


def _evaluation_files(model, model_name: str, path: Path, root: Path, marks: Marks) -> EvaluationFiles | None:
    """The evaluation's files (`evaluate:` or the older `evaluation:`), inside the project and present: inputs,
    labels, and for a `module:function` metric the module's .py file (a dotted path under the spec's
    directory: never a module from sys.path, so a spec cannot run code from outside its project)."""
    key = "evaluate" if model.evaluate is not None else "evaluation"
    ev = model.evaluation_spec
    if ev is None:
        return None
    found: dict[str, Path | None] = {}
    for what in ("inputs", "labels"):
        rel = getattr(ev, what)
        if rel is None:
            found[what] = None
            continue
        where = locate(marks, ("models", model_name, key, what), Location(str(path)))
        f = inside(path.parent / rel, root, f"{key} {what} file", where)
        if not f.is_file():
            raise InputError(f"{key} {what} file '{rel}' not found", where)
        found[what] = f
    module = None
    if ":" in ev.metric:
        where = locate(marks, ("models", model_name, key, "metric"), Location(str(path)))
        dotted = ev.metric.split(":")[0]
        rel = Path(*dotted.split(".")).with_suffix(".py")
        module = inside(path.parent / rel, root, "metric module", where)
        if not module.is_file():
            raise InputError(f"metric module '{dotted}' not found (expected {rel} beside the spec)", where)
    inputs = found["inputs"]
    assert inputs is not None
    return EvaluationFiles(inputs, found["labels"], module)


def _spec_search_path(data: dict, marks: Marks, path: Path, root: Path) -> SearchPath:
    extra = []
    entries = data.get("search_paths", [])
    if isinstance(entries, list):
        for i, entry in enumerate(entries):
            if isinstance(entry, str):
                where = locate(marks, ("search_paths", i), Location(str(path)))
                extra.append(inside(path.parent / entry, root, "search path", where))
    return default_search_path(root, extra)


def collect_spec_files(paths: Iterable[Path]) -> list[Path]:
    """Expand directories into their *.yaml specs (sorted); files are taken as given."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.glob("*.yaml") if f.is_file()) + sorted(f for f in p.glob("*.yml") if f.is_file())
            if not found:  # a wrong directory, not an empty success (`validate` said `ok: 0 spec(s)`)
                raise InputError("no compile spec here (*.yaml, *.yml)", str(p))
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("no such file or directory", str(p))
    return files


def load_specs(paths: Iterable[Path]) -> list[Build]:
    builds: list[Build] = []
    seen: dict[str, Path] = {}
    for f in collect_spec_files(paths):
        for b in load_spec(f):
            if b.id in seen and seen[b.id] != f.resolve():
                raise InputError(f"build '{b.id}' is also defined in {seen[b.id]}", str(f))
            seen[b.id] = f.resolve()
            builds.append(b)
    return builds


def adhoc_builds(model_path: Path, target_names: list[str], pipeline_name: str = "default",
                 project_root: Path | None = None) -> list[Build]:
    """Builds for `npubuild compile`: one model, named targets, default settings, no YAML."""
    root = (project_root or project_dir()).resolve()
    search = default_search_path(root)
    where = Location("<command line>")
    if not model_path.is_file():
        raise InputError("model file not found", str(model_path))
    pipeline, _ = load_pipeline(pipeline_name, search, where)
    profiles = [load_target(name, search, where)[0] for name in target_names]  # each name checked first
    try:
        spec = CompileSpec(name="adhoc", models={_safe_name(model_path.stem): {"path": str(model_path.resolve())}},
                           targets=target_names)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"--target: {first.get('msg', 'invalid')}", where) from None
    families = lowering_families(profiles)
    return [Build(spec=spec, spec_path=root / "<command line>", project_root=root, model_name=next(iter(spec.models)),
                  model_path=model_path.resolve(), calibration_npy=None, target=profile, pipeline=pipeline,
                  vela=vela_options(profile.vela, None, profile.optimise), spec_families=families)
            for profile in profiles]


def lowering_families(profiles: list[TargetProfile]) -> tuple[str, ...]:
    """The sorted lowering families of these targets (each once)."""
    return tuple(sorted({Accelerator.parse(p.accelerator).lowering_family for p in profiles}))


def _safe_name(stem: str) -> str:
    import re

    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", stem).lstrip("._-")
    return cleaned or "model"


def spec_paths(values: list[str]) -> list[Path]:
    """Command-line spec arguments (relative to the cwd); none means the project's configs/ directory."""
    if values:
        return [Path(v) for v in values]
    configs = project_dir() / "configs"
    if not configs.is_dir():
        raise InputError(f"no compile specs: {configs} does not exist (name spec files or directories, or run "
                         "inside a project: the nearest directory up with a dodo.py, pyproject.toml or .git)")
    return [configs]
