"""doit entry point: `doit` builds every compile spec in configs/ into build/.

The same task graph as `npubuild build configs/`; both share build/.doit.db.
Set NPUBUILD_SPECS (paths separated by ':') or NPUBUILD_BUILD_DIR to change
what is built and where; NPUBUILD_WAIT=1 waits for a build dir another build holds.
"""

import os
import sys
from pathlib import Path

from npubuild.build.doit_executor import new_run_id
from npubuild.build.lock import acquire
from npubuild.build.plan import make_plan
from npubuild.build.session import namespace
from npubuild.config.load import load_specs
from npubuild.errors import NpubuildError

_here = Path(__file__).parent
_specs = [Path(p) for p in os.environ.get("NPUBUILD_SPECS", str(_here / "configs")).split(":")]
try:
    _plan = make_plan(load_specs(_specs), Path(os.environ.get("NPUBUILD_BUILD_DIR", _here / "build")))
except NpubuildError as _exc:
    print(_exc, file=sys.stderr)
    sys.exit(_exc.exit_code)
try:  # held until doit exits: no other build may write this build dir meanwhile
    _lock = acquire(_plan.build_dir, wait=os.environ.get("NPUBUILD_WAIT") == "1")
except NpubuildError as _exc:
    print(_exc, file=sys.stderr)
    sys.exit(_exc.exit_code)
globals().update(namespace(_plan, new_run_id()))
