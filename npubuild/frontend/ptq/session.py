"""The onnxruntime session options every PTQ measurement runs with (statistics, scoring, bias correction,
equalisation).

Quiet logging, and the intra-op thread pool's workers sleeping rather than spinning between a run's
parallel sections (`session.intra_op.allow_spinning` 0): spinning only changes how an idle worker
waits, not which worker computes what, so every output is the same bit for bit (bench/ptq_speed.py over
the real models); on a machine shared with other builds a spinning worker burns a core doing nothing,
and the choice's hundreds of short runs made that a large part of its CPU time (issue 33).
"""

from __future__ import annotations

from typing import Any


def session_options() -> Any:
    """An onnxruntime SessionOptions for the PTQ sessions (onnxruntime imported on first use, as the stage's
    other code does)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts
