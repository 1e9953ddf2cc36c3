"""`python -m npubuild.models OUT_DIR [NAME ...]`: write the example models as OUT_DIR/NAME.onnx."""

from __future__ import annotations

import sys
from pathlib import Path

from npubuild.fileio import write_bytes
from npubuild.models.zoo import MODELS


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: python -m npubuild.models OUT_DIR [{'|'.join(MODELS)} ...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    names = argv[1:] or list(MODELS)
    for name in names:
        if name not in MODELS:
            print(f"error: unknown model '{name}' (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        write_bytes(out / f"{name}.onnx", MODELS[name]().SerializeToString())
        print(out / f"{name}.onnx")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
