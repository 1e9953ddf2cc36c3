"""The `npubuild` command line. Exit codes: 0 built and gates hold, 1 a stage or gate failed, 2 bad input."""

from __future__ import annotations

import argparse
import gc
import re
import sys
import traceback

from npubuild.commands import register_all
from npubuild.errors import DiskFull, InputError, NpubuildError, is_disk_full, written_path
from npubuild.longlived import long_lived
from npubuild.suggest import did_you_mean

EPILOG = """\
exit codes:
  0  built, and every gate holds (report: the baseline comparison found no regression)
  1  a stage failed, a gate fell short, a regression against the baseline, or a full disk
  2  bad input: a config, a model or an argument to fix (one line, file:line:col for YAML)
  130 interrupted (Ctrl-C); everything finished so far is kept

environment:
  NPUBUILD_CACHE       shared stage cache, a directory or fsspec URL, or 'off'
                       (default: .npubuild/cache in the project holding the build dir)
  NPUBUILD_CACHE_KEY   the team key signing the shared cache's entries (or NPUBUILD_CACHE_KEY_FILE);
                       a cache reached over a URL needs it, or NPUBUILD_CACHE_UNKEYED=1 (trust every writer)
  NPUBUILD_STAGE_MEMORY_MIB  memory a stage task may add to the build process (default 4096)
  NPUBUILD_STAGE_WORKERS     worker processes a stage may fan out to (default: the cores; never more
                       than the machine holds, as for -n)
  NPUBUILD_WAIT=1      plain doit: wait for a build dir another build holds (npubuild build: --wait)
  NPUBUILD_SPECS       plain doit: spec files or directories, separated by ':' (default: configs/)
  NPUBUILD_BUILD_DIR   plain doit: the build directory (default: build/ next to dodo.py)
  NPUBUILD_HISTORY     npubuild report: the history directory when --history is not given
  DOIT_SEEK_FILE=1     plain doit from a subdirectory finds the project's dodo.py (or: doit -k)

The project is the nearest directory up from the current one with a dodo.py, pyproject.toml or .git:
commands find its configs/ and build/ from any subdirectory.
"""


class UsageError(InputError):
    """A bad command line: one line and exit 2, also under --debug (argparse's own error, no traceback)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with each option's default appended where it has one (and the help does not say it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "default" in text or default in (None, False, argparse.SUPPRESS) or (
                not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 like every other bad input, with a suggestion for a
    mistyped subcommand."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            hint = did_you_mean(m.group(1), choices) or f" (choose from {', '.join(choices)})"
            message = f"{message[:m.start()]}invalid choice: '{m.group(1)}'{hint}"
        raise UsageError(f"{self.prog}: {message}")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, but an unknown option is named with the closest option of the command it was given to
        (`--keepgoing`: did you mean '--keep-going'?), one line per option."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            sub = self._subparsers_by_name().get(command) if command else None
            options = [o for a in (sub or self)._actions for o in a.option_strings if o.startswith("--")]
            where = f"{self.prog} {command}" if sub is not None else self.prog
            hints = {e: did_you_mean(e.split("=", 1)[0], options) if e.startswith("-") else None for e in extras}
            if len(extras) == 1:
                what = f"unrecognized argument: {extras[0]}{hints[extras[0]] or ''}"
            else:
                what = "unrecognized arguments: " + ", ".join(
                    f"{e} ({hints[e][2:]})" if hints[e] else e for e in extras)
            raise UsageError(f"{where}: {what}")
        return parsed

    def _subparsers_by_name(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _version() -> str:
    from npubuild.version import __version__

    return f"npubuild {__version__}"


def make_parser() -> Parser:
    p = Parser(prog="npubuild", description="Build ONNX models for Arm Ethos-U NPUs from YAML compile specs.",
               epilog=EPILOG)
    p.add_argument("-V", "--version", action="version", version=_version())
    p.add_argument("--debug", action="store_true", help="show Python tracebacks (also accepted after the subcommand)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    register_all(sub)
    for sp in sub.choices.values():  # `npubuild build --debug` as well as `npubuild --debug build`
        if "--debug" not in sp._option_string_actions:
            sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help="show Python tracebacks")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input is one line and exit 2, also with --debug (which adds the traceback
    above it), before or after the subcommand; a usage error never shows one."""
    program = argv is None  # the process's own command line: the console script, `python -m npubuild`
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = False
    try:
        with long_lived():  # the subcommands' modules (numpy with some): for the life of the process
            try:
                args = make_parser().parse_args(argv)
            except SystemExit as done:  # --help, --version: printed; the exit code returned, not raised
                return done.code if isinstance(done.code, int) else 0
        debug = args.debug
        return args.func(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except NpubuildError as exc:
        if debug:
            traceback.print_exc()
        print(exc, file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a path from the command line or the environment: one line, exit 2
        if debug:
            traceback.print_exc()
        if is_disk_full(exc):  # not the path's fault: the disk it is on (exit 1)
            print(DiskFull(written_path(exc), "a file of this command"), file=sys.stderr)
            return 1
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{where}error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: one line (the traceback with --debug), exit 1
        if debug:
            raise
        if is_disk_full(exc):
            print(DiskFull(written_path(exc), "a file of this command"), file=sys.stderr)
            return 1
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: internal error: {type(exc).__name__}: {first} (--debug shows the traceback)", file=sys.stderr)
        return 1
    finally:
        if program:  # the process ends next: its final collection need not walk every object (~0.18 CPU s)
            gc.freeze()
        else:  # called in process (tests, tools): what long_lived froze is collectable again
            gc.unfreeze()


if __name__ == "__main__":
    raise SystemExit(main())
