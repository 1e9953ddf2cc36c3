"""long_lived(): the collector paused in the block, what exists frozen after it, its state restored."""

from __future__ import annotations

import gc

from npubuild.longlived import long_lived


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_block_runs_without_the_collector_and_its_objects_are_frozen_after():
    assert gc.isenabled()
    try:
        with long_lived():
            assert not gc.isenabled()
            kept = Node()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # in the permanent generation, out of every pass
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())


def test_a_disabled_collector_stays_disabled_and_an_exception_still_freezes():
    gc.disable()
    try:
        try:
            with long_lived():
                raise KeyError("x")
        except KeyError:
            pass
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


def test_cycles_made_after_the_block_are_still_collected():
    try:
        with long_lived():
            pass
        Node()
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()


def _freeze_count_after(call: str) -> int:
    import subprocess
    import sys

    code = f"import gc, sys\nfrom npubuild.cli import main\nsys.argv = ['npubuild', 'targets']\n{call}\nprint(gc.get_freeze_count())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


def test_the_program_ends_frozen_and_a_call_in_process_does_not():
    assert _freeze_count_after("main()") > 10_000  # the process's own command: its exit skips walking them
    assert _freeze_count_after("main(['targets'])") == 0  # a caller that goes on gets them collected again
