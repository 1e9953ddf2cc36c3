"""doit entry point: `doit` builds every compile spec in configs/ into build/, as `npubuild build` does.

The same plan, stage dirs, shared cache and reports as `npubuild build configs/`. NPUBUILD_SPECS
(paths separated by ':'), NPUBUILD_BUILD_DIR and NPUBUILD_CACHE change what is built, where, and
with which shared cache; NPUBUILD_WAIT=1 waits for a build dir another build holds.
"""

from npubuild import dodo_namespace

globals().update(dodo_namespace(__file__))
