"""`npubuild cache stats|prune|verify`: look after the shared stage cache."""

from __future__ import annotations

from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import InputError


def _cache(args):
    from npubuild.engine.cache import StageCache, resolve_cache

    url = resolve_cache(args.cache, build_dir_of(args))
    if url is None:
        raise InputError("--cache off: there is no cache to look after")
    if "://" not in url and not Path(url).is_dir():
        raise InputError(f"no stage cache at '{url}'")
    return StageCache(url)


def cmd_cache(args) -> int:
    from npubuild.engine.cache import parse_age
    from npubuild.report.brief import human_bytes

    cache = _cache(args)
    if args.action == "stats":
        s = cache.stats()
        debris = f", {human_bytes(s['debris_bytes'])} left by killed writers (verify/prune remove it)" \
            if s["debris_bytes"] else ""
        print(f"{s['url']}: {s['entries']} entries, {human_bytes(s['bytes'])}{debris}")
    elif args.action == "verify":
        total, bad = cache.verify()
        print(f"{total} entries checked, {len(bad)} bad (discarded)")
        for k in bad:
            print(f"  discarded {k}")
        return 1 if bad else 0
    else:
        if not args.older_than:
            raise InputError("cache prune needs --older-than AGE (e.g. 30d)")
        removed = cache.prune(parse_age(args.older_than))
        print(f"pruned {removed} entries older than {args.older_than}")
    return 0


def register(sub) -> None:
    c = sub.add_parser("cache", help="shared stage cache: stats, prune --older-than 30d, verify")
    c.add_argument("action", choices=["stats", "prune", "verify"],
                   help="stats: entries and size; prune: drop old entries; verify: check every file, discard bad")
    c.add_argument("--cache", metavar="DIR_OR_URL", help="cache directory or fsspec URL (default: $NPUBUILD_CACHE, "
                   "else .npubuild/cache in the project holding the build dir)")
    add_build_dir(c)
    c.add_argument("--older-than", metavar="AGE", help="with prune: age such as 30d, 12h (required for prune)")
    c.set_defaults(func=cmd_cache)
