"""`python -m npubuild.models OUT_DIR [--torch] [NAME ...]`: write the example models as OUT_DIR/NAME.onnx.

Without names it writes every model built by our own code; `--torch` adds the
ones exported with torch.onnx (torch is a test-only dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path

from npubuild.fileio import write_bytes
from npubuild.models.zoo import MODELS

TORCH_NAMES = ("resnet8_torch", "mobilenet_v3_block_torch", "transformer_torch", "transformer_dynamo",
               "unet_torch")


def generators(with_torch: bool) -> dict:
    """Name -> generator; the torch module is imported only when a torch model is asked for."""
    gens = dict(MODELS)
    if with_torch:
        from npubuild.models.torch_zoo import TORCH_MODELS

        gens.update(TORCH_MODELS)
    return gens


def main(argv: list[str]) -> int:
    with_torch = "--torch" in argv
    args = [a for a in argv if a != "--torch"]
    known = [*MODELS, *TORCH_NAMES]
    if not args:
        print(f"usage: python -m npubuild.models OUT_DIR [--torch] [{'|'.join(known)} ...]", file=sys.stderr)
        return 2
    out = Path(args[0])
    names = args[1:]
    for name in names:
        if name not in known:
            print(f"error: unknown model '{name}' (known: {', '.join(known)})", file=sys.stderr)
            return 2
    gens = generators(with_torch or any(n in TORCH_NAMES for n in names))
    for name in names or list(gens):
        write_bytes(out / f"{name}.onnx", gens[name]().SerializeToString())
        print(out / f"{name}.onnx")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
