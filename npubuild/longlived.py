"""Work that makes objects for the life of the process (imports, the build plan), without the cyclic collector.

Importing onnx, onnxruntime, onnx_ir, Vela and npubuild's stages makes a few hundred thousand objects that stay
until the process ends; the collector walks them again and again as they are made (~0.09 CPU s of a cold
DS-CNN compile, most of the build process's own time after its imports), and once more in every forked stage
child that collects. `long_lived()` pauses it while such work runs and then freezes what exists
(gc.freeze: kept out of every later collection, the forked children's too), as the gc documentation advises
before fork().
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def long_lived() -> Iterator[None]:
    """Run the block with the collector paused, then freeze every object that exists (the collector is left as
    it was found, so a caller that disabled it keeps it disabled)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
