"""The `npubuild` command line. Exit codes: 0 built and gates hold, 1 a stage or gate failed, 2 bad input."""

from __future__ import annotations

import argparse
import sys

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
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = make_parser().parse_args(argv)
        return args.func(args)
    except NpubuildError as exc:
        if debug:
            raise
        print(exc, file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
