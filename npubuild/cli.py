"""The `npubuild` command line. Exit codes: 0 built and gates hold, 1 a stage or gate failed, 2 bad input."""

from __future__ import annotations

import argparse
import sys
import traceback

from npubuild.commands import register_all
from npubuild.errors import InputError, NpubuildError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 like every other bad input."""

    def error(self, message: str):  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")


def make_parser() -> Parser:
    p = Parser(prog="npubuild", description="Build ONNX models for Arm Ethos-U NPUs from YAML compile specs.")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    register_all(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input is one line and exit 2, also with --debug (which adds the traceback
    above it); a usage error never shows one (`validate --debug` is a usage error: --debug comes first)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = False
    try:
        args = make_parser().parse_args(argv)
        debug = args.debug
        return args.func(args)
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
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{where}error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: one line (the traceback with --debug), exit 1
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: internal error: {type(exc).__name__}: {first} (--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
