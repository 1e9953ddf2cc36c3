"""ONNX's own backend node tests through npubuild (nodetests.py), in FP and in INT with Vela placement: each
selected test passes, runs (partly) on the host with the reason, or is listed in expected.py with why; none
crashes. bench/conformance.py prints the outcome table and the time."""

from __future__ import annotations

import pytest
from npbtest.conformance import NodeCase, Result, VelaRunner, quiet_onnxruntime, run_fp, run_int, select
from npbtest.conformance.expected import EXPECTED_FP, EXPECTED_INT

CASES = select()
OK = ("pass", "host")


@pytest.fixture(scope="module")
def vela():
    quiet_onnxruntime()
    runner = VelaRunner()  # one Vela worker process for every INT test
    yield runner
    runner.close()


def _judge(case: NodeCase, result: Result, expected: dict[str, str]) -> None:
    assert result.outcome != "crash", f"{case.name}: a Python exception out of npubuild: {result.detail}"
    why = expected.get(case.name)
    if why is None:
        assert result.outcome in OK, f"{case.name}: {result.outcome}: {result.detail}"
    else:
        assert result.outcome not in OK, f"{case.name} now {result.outcome}: take it off expected.py ({why})"


def test_the_selection_is_the_embedded_op_set():
    names = {c.name for c in CASES}
    assert len(CASES) > 650 and sum("_expanded" in n for n in names) > 150
    assert set(EXPECTED_FP) <= names and set(EXPECTED_INT) <= names  # no stale entries


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fp(case: NodeCase):
    quiet_onnxruntime()
    _judge(case, run_fp(case), EXPECTED_FP)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_int(case: NodeCase, vela: VelaRunner):
    _judge(case, run_int(case, vela), EXPECTED_INT)
