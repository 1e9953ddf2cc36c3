"""The U85 machine on hand-made command streams: chaining buffers, the kept accumulator, and what is not modelled
(control flow, the TANH/SIGMOID LUT functions, TILE3X1 storage) failing as NotModelled with the op named."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.npusim import assert_batch_is_each_alone

from npubuild.errors import StageError
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import RawModel, TensorPlace
from npubuild.npusim.sim import run
from npubuild.npusim.u85.registers import BY_NAME


def w(name: str, param: int = 0, data: int | None = None) -> list[int]:
    """One command by register name: cmd0 (16-bit parameter) or cmd1 (parameter and 32-bit payload)."""
    reg = BY_NAME[name]
    if reg.long:
        return [reg.code | 0x4000 | (param & 0xFFFF) << 16, (data or 0) & 0xFFFFFFFF]
    return [reg.code | (param & 0xFFFF) << 16]


SIGNED8 = 1  # PRECISION: signed, 8 bits, NHWC, TILE2X2
CHAINED = 2 << 14
GLOBAL = 1 << 8  # OFM_PRECISION: OFM_SCALE for every channel (else the scale stream's)
UNIT = w("IFM_SCALE", 0, 1) + w("IFM2_SCALE", 0, 1) + w("OFM_SCALE", 1 << 13, 1)  # scale 1, shift 0, natural


def _fm(prefix: str, base: int, region: int = 1, precision: int = SIGNED8) -> list[int]:
    """A 1x2x4 int8 NHWC feature map at `base`."""
    words = w(f"{prefix}_PRECISION", precision) + w(f"{prefix}_REGION", region) + w(f"{prefix}_BASE0", 0, base)
    for i in (1, 2, 3):
        words += w(f"{prefix}_BASE{i}", 0, 0)
    words += (w(f"{prefix}_HEIGHT0_M1", 0) + w(f"{prefix}_HEIGHT1_M1", 0) + w(f"{prefix}_WIDTH0_M1", 1)
              + w(f"{prefix}_STRIDE_X", 0, 4) + w(f"{prefix}_STRIDE_Y", 0, 8) + w(f"{prefix}_STRIDE_C", 0, 1))
    return words


SHAPE = w("OFM_HEIGHT_M1", 0) + w("OFM_WIDTH_M1", 1) + w("OFM_DEPTH_M1", 3) + w("IFM_DEPTH_M1", 3)
CLIP = w("ACTIVATION", 0) + w("ACTIVATION_MIN", -128) + w("ACTIVATION_MAX", 127)


def _model(words: list[int]) -> RawModel:
    """Inputs a (offset 0) and b (8) and output (16) in region 1, each 1x2x4 int8."""
    stream = np.array([*words, *w("STOP", 0xFFFF)], np.uint32)
    places = [TensorPlace((1, 1, 2, 4), 1, 1, off) for off in (0, 8, 16)]
    return RawModel("hand-made", "ethos-u85-256", 1, stream, b"\0" * 64, 0, 1, 64, 2, 0, 16, places[:2], places[2:])


def _inputs() -> list[np.ndarray]:
    a = np.arange(8, dtype=np.int8).reshape(1, 1, 2, 4) - 3
    return [a, (a * 5).astype(np.int8)]


ADD, MUL = w("ELEMENTWISE", 1), w("ELEMENTWISE", 0)
BROADCAST_NONE = w("IFM_BROADCAST", 0) + w("IFM2_BROADCAST", 0)


FIRST = UNIT + _fm("IFM", 0) + _fm("IFM2", 8) + _fm("OFM", 0, region=3, precision=SIGNED8 | CHAINED | GLOBAL)
SECOND = _fm("IFM", 0, region=3, precision=SIGNED8 | CHAINED) + _fm("IFM2", 0) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL)
CHAIN = SHAPE + CLIP + BROADCAST_NONE + FIRST + ADD + SECOND + MUL
POOL = w("KERNEL_WIDTH_M1", 0) + w("KERNEL_HEIGHT_M1", 0) + w("KERNEL_STRIDE", 0) + w("POOL", 3)
KEEP = (SHAPE + CLIP + UNIT + _fm("IFM", 0) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL)
        + w("ACC_FORMAT", 1 << 6) + POOL  # reset, output disabled
        + _fm("IFM", 8) + w("ACC_FORMAT", 1 << 4) + POOL)  # keep, output enabled
# DMA D2 with an indexed source: a's two 4-byte rows to the output in the order of the int32 index list in b
GATHER = (w("DMA0_SRC_REGION", 1 | 1 << 9 | 1 << 11) + w("DMA0_DST_REGION", 1) + w("DMA0_SRC", 0, 0)
          + w("DMA0_DST", 0, 16) + w("DMA0_LEN", 0, 4) + w("DMA0_SIZE0", 2) + w("DMA0_SRC_STRIDE0", 0, 4)
          + w("DMA0_DST_STRIDE0", 0, 4) + w("DMA0_IDX", 0, 8) + w("DMA0_IDX_REGION", 1) + w("DMA0_IDX_MAX", 0, 1)
          + w("DMA_START"))


def test_chained_operand_goes_through_a_chaining_buffer():
    """(a + b) chained to buffer 3, then (chained * a) to memory: a*(a + b), without the sum touching memory."""
    second = SECOND
    words = CHAIN
    a, b = _inputs()
    res = run(_model(words), [a, b])
    want = np.clip(a.astype(np.int64) * (a.astype(np.int64) + b), -128, 127)
    np.testing.assert_array_equal(res.outputs[0], want)
    assert [op.ofm_format for op in res.ops] == ["CHAINED", "NHWC"]
    # an op that reads a chaining buffer nothing wrote names itself
    with pytest.raises(StageError, match=r"NPU op #0 ELEMENTWISE: .*chaining buffer 3"):
        run(_model(SHAPE + CLIP + BROADCAST_NONE + UNIT + second + MUL), [a, b])


def test_kept_accumulator_sums_across_ops():
    """SUM pool of a with the output disabled, then SUM pool of b keeping it: a + b written once."""
    a, b = _inputs()
    res = run(_model(KEEP), [a, b])
    np.testing.assert_array_equal(res.outputs[0], np.clip(a.astype(np.int64) + b, -128, 127))
    assert [op.ofm_format for op in res.ops] == ["ACC", "NHWC"]


def _gather_inputs(i0: int, i1: int, seed: int) -> list[np.ndarray]:
    a = np.random.default_rng(seed).integers(-128, 128, (1, 1, 2, 4)).astype(np.int8)
    return [a, np.array([i0, 0, 0, 0, i1, 0, 0, 0], np.int8).reshape(1, 1, 2, 4)]


def test_gather_by_data_indices_takes_the_rows_the_data_names():
    for i0, i1 in ((1, 0), (0, 1), (1, 1)):
        a, b = _gather_inputs(i0, i1, 3)
        res = run(_model(GATHER), [a, b])
        np.testing.assert_array_equal(res.outputs[0].reshape(2, 4), a.reshape(2, 4)[[i0, i1]])


@pytest.mark.parametrize("case", ["chain", "keep", "gather"])
def test_a_batch_of_samples_gives_each_what_it_gives_alone(case):
    """run_samples (memory, chaining buffers and the kept accumulator with a sample axis) gives every sample's
    outputs and op OFMs as `run` on it alone: chained operands, a kept accumulator (an ACC OFM), and a DMA
    whose index list is data (each sample's indices differ: copied sample by sample)."""
    words = {"chain": CHAIN, "keep": KEEP, "gather": GATHER}[case]
    if case == "gather":
        samples = [_gather_inputs(i0, i1, seed) for seed, (i0, i1) in enumerate(((1, 0), (0, 1), (1, 1)))]
    else:
        a, b = _inputs()
        samples = [[a, b], [b, b], [(a * 3).astype(np.int8), b]]
    model = _model(words)
    alone = [run(model, xs) for xs in samples]
    assert len({r.outputs[0].tobytes() for r in alone}) == 3  # the samples differ
    assert_batch_is_each_alone(model, samples, alone)


@pytest.mark.parametrize("case,match", [
    ("branch", r"NPU op #0 BRANCH: control flow"),
    ("sigmoid", r"NPU op #0 ELEMENTWISE: activation LUT_SIGMOID is not modelled"),
    ("tile3x1", r"NPU op #0 ELEMENTWISE: IFM storage TILE3X1"),
])
def test_unmodelled_features_name_the_op(case, match):
    words = SHAPE + CLIP + BROADCAST_NONE + UNIT + _fm("IFM", 0) + _fm("IFM2", 8) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL)
    if case == "branch":
        words = w("BRANCH", 0, 0)
    elif case == "sigmoid":
        words += w("ACTIVATION", 11) + ADD
    else:
        words += w("IFM_PRECISION", SIGNED8 | 1 << 14) + ADD
    with pytest.raises(NotModelled, match=match):
        run(_model(words), _inputs())


def test_the_simulator_runs_on_one_blas_thread_and_restores_the_count(monkeypatch):
    """npusim.sim limits BLAS to one thread while a command stream runs (its products are exact either way,
    and a second thread costs more CPU than it saves), and puts the count back afterwards."""
    from threadpoolctl import threadpool_info

    import npubuild.npusim.u85.machine as machine

    def blas_threads() -> list[int]:
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before, during = blas_threads(), []
    real = machine.run_samples
    monkeypatch.setattr(machine, "run_samples", lambda *a: during.extend(blas_threads()) or real(*a))
    a, b = _inputs()
    res = run(_model(CHAIN), [a, b])
    np.testing.assert_array_equal(res.outputs[0], np.clip(a.astype(np.int64) * (a.astype(np.int64) + b), -128, 127))
    assert before and during == [1] * len(before) and blas_threads() == before
