"""`npubuild clean [--stale]`: remove a build dir's outputs, or only those the current plan no longer uses.

Stale = stage dirs under <build-dir>/stages and build dirs under
<build-dir>/builds that no task of the current plan (the specs given, default
configs/) refers to: results of old configs, old tool versions, removed
targets. Runs under the build-dir lock, so it never races a build.

The shared stage cache is not in the build dir (by default it is .npubuild/cache in the project), so a
clean build dir refills from it instead of rebuilding cold; `npubuild cache prune` looks after the cache.
The build dir's own Vela cache (<build-dir>/.cache/vela, ethosu/vela_cache.py) is pruned by --stale as that
cache prunes itself on a write: its killed writers' debris (any age: the lock is held, no writer is alive) and
the least recently used entries past its bound. Which entries the current plan would still use cannot be told
from their content keys without compiling its graphs again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import InputError


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def stale_dirs(build_dir: Path, keep: set[Path]) -> list[Path]:
    """Task dirs under stages/<stage>/ and builds/<spec>/<model>/<target>/ not in `keep`."""
    out = []
    stages = build_dir / "stages"
    if stages.is_dir():
        out += [d for s in sorted(stages.iterdir()) if s.is_dir() for d in sorted(s.iterdir())
                if d.is_dir() and d not in keep]
    builds = build_dir / "builds"
    if builds.is_dir():
        for d in sorted(builds.glob("*/*/*")):
            if d.is_dir() and d not in keep:
                out.append(d)
    return out


def stale_plots(build_dir: Path) -> list[Path]:
    """Cached report plots older than the last report.html (each report touches the plots it embeds)."""
    html = build_dir / "report.html"
    plots = build_dir / ".cache" / "plots"
    if not html.is_file() or not plots.is_dir():
        return []
    newest = html.stat().st_mtime - 0.5  # the plots are touched just before the page is written
    return sorted(p for p in plots.glob("*.png") if p.stat().st_mtime < newest)


def top_level_debris(build_dir: Path) -> list[Path]:
    """Temp files a killed run left beside the reports (fileio.atomic_path's `.report.json.*.tmp`)."""
    return sorted(p for p in build_dir.glob(".*") if p.is_file() and p.suffix in (".tmp", ".part"))


def _prune_empty(root: Path) -> None:
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()


def cmd_clean(args) -> int:
    from npubuild.engine.lock import LOCK_NAME, locked
    from npubuild.engine.uptodate import debris_in, remove_debris
    from npubuild.ethosu.vela_cache import for_build_dir

    build_dir = build_dir_of(args).resolve()
    if not build_dir.is_dir():
        raise InputError("no such build dir", str(build_dir))
    if args.stale:
        from npubuild.config.load import load_specs, spec_paths
        from npubuild.engine.plan import make_plan
        from npubuild.stages import STAGES

        plan = make_plan(load_specs(spec_paths(args.specs)), build_dir, STAGES)
        keep = {t.dir for t in plan.tasks.values()}
        vela = for_build_dir(build_dir)
        with locked(build_dir, args.wait):
            dirs, plots = stale_dirs(build_dir, keep), stale_plots(build_dir)
            debris = [p for d in sorted(keep) for p in debris_in(d)] + top_level_debris(build_dir)
            vela_debris, vela_over = (vela.store.debris(grace_s=0.0), vela.over_bound()) if vela.root.is_dir() \
                else ([], [])
            victims = dirs + plots + debris + [Path(p) for p, _ in vela_debris] + [vela.entry(k) for k, _ in vela_over]
            freed = sum(_size(d) for d in dirs + plots + debris) + sum(n for _, n in vela_debris + vela_over)
            if not args.dry_run:
                for d in dirs + plots:
                    shutil.rmtree(d) if d.is_dir() else d.unlink()
                remove_debris(debris)
                _prune_empty(build_dir / "builds")
                if vela_debris or vela_over:
                    vela.prune(grace_s=0.0)
        verb = "would remove" if args.dry_run else "removed"
        for d in victims if args.dry_run else []:
            print(d.relative_to(build_dir))
        past_bound = f", {len(vela_over)} cached Vela compile(s) past its bound" if vela_over else ""
        print(f"{verb} {len(dirs)} stale task dir(s), {len(debris) + len(vela_debris)} temp file(s) of killed runs "
              f"and {len(plots)} plot(s){past_bound}, {freed / 2**20:.1f} MiB; kept {len(keep)} used by the current "
              "plan")
        return 0
    if args.specs:
        raise InputError("spec arguments only make sense with --stale")
    with locked(build_dir, args.wait):
        entries = [p for p in sorted(build_dir.iterdir()) if p.name != LOCK_NAME]
        freed = sum(_size(p) if p.is_dir() else p.stat().st_size for p in entries)
        if not args.dry_run:
            for p in entries:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    print(f"{'would remove' if args.dry_run else 'removed'} everything in {build_dir} "
          f"({len(entries)} entries, {freed / 2**20:.1f} MiB)")
    return 0


def register(sub) -> None:
    c = sub.add_parser("clean", help="remove build outputs (--stale: only those the current plan does not use)")
    c.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR", help="with --stale: the specs whose plan is current "
                   "(default: the project's configs/)")
    add_build_dir(c)
    c.add_argument("--stale", action="store_true", help="remove only task dirs the current plan does not refer to")
    c.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    c.add_argument("--wait", action="store_true", help="wait for a build holding the build dir")
    c.set_defaults(func=cmd_clean)
