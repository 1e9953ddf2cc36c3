"""Two Vela 5.2 (regor) miscompiles of a SLICE next to a RESCALE, kept as TOSA reproductions.

1. A SLICE whose int8 result is widened to int32 by a RESCALE that Vela does not fuse into its consumer
   (Ethos-U55/U65): Vela lowers the RESCALE to an ADD and a MUL over the *unsliced* tensor, so the NPU reads
   the wrong channels and writes past the int32 result; npu-sim stops on the out-of-region write. U85 is right.
   npubuild's lowering widens slices only into ops Vela fuses the RESCALE into (the softmax's row max, the
   int8 Add/Mul): no example or real model reaches this form (their builds are bit-exact in npu-sim); a CAST
   widening avoids it but cost 8-13% of the transformer's and MobileViT's cycles, so npu-sim is the guard.
2. A SLICE (not at channel 0) of a RESCALE with a multiplier per channel, on every Ethos-U: Vela moves the
   slice ahead of the RESCALE, running each slice as a per-channel POOL, but points every one of them at the
   scale stream of the first channels. A softmax of a per-channel Mul's output (its row max slices the row in
   halves) hit it: 77 of 6000 outputs differed on U55, U65 and U85 alike. The lowering now emits the slice
   first and a RESCALE of its own channels (LoweringContext.ChannelRescale): bit-exact everywhere.
3. One row of a [rows, 1, C] tensor (a recurrent layer's time step) sliced, reshaped and widened to int32 by a
   RESCALE Vela does not fuse into the ADD after it (Ethos-U55/U65): Vela copies the row with an OFM tile base
   that loses it (npu-sim reads row 1 where TOSA takes row 2). int8 builds widen by 2**20, which Vela fuses into
   the ADD; the 16x8 ADD's 2**15 form is bit-exact on its own and in every example (what failed the 16x8 GRU on
   U55 was item 4). U85 is right.
4. Two SLICEs of the result of a RESCALE from int32 (an int16 sigmoid's TABLE result, split into a GRU's update
   and reset gates), on Ethos-U55/U65: Vela moves each SLICE ahead of the RESCALE and runs the RESCALE, as a MUL,
   over all channels from channel 0 for each, into a buffer sized for the slice (npu-sim stops on the
   out-of-region write; in gru_kws the reset gate read the update gate). This is what failed configs/
   kws_recurrent.yaml's GRU in 16x8 on U55. A full-range CLAMP between the RESCALE and the SLICEs, which Vela
   fuses into the RESCALE's own NPU op, avoids it: the U55/U65 lowering emits it
   (LoweringOptions.clamp_sliced_rescale). U85 is right either way.
5. The result of a RESCALE from int32 written into a CONCAT after its first input (Ethos-U55/U65), int8 or int16:
   Vela writes it at the CONCAT's channel 0, over the first input. An int16 activation (TABLE, then the RESCALE of
   its int32 result) concatenated in ppocrv4_rec_48x160 hit it (p2o.Concat.8: 132493 of 132500 outputs wrong on
   U55). The same CLAMP avoids it, at no NPU op or cycle more on U55.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import tosa_serializer as ts
from npbtest.npusim import compile_and_check, reference, tosa_inputs, vela_raw
from npbtest.tosa_graphs import Graph, attr
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run


def _slice(g: Graph, x: str, rows: int, start: int, size: int) -> str:
    return g.op(ts.Op.SLICE, [x, g.shape([0, 0, start]), g.shape([1, rows, size])], [1, rows, size], np.int8,
                attr("Slice"))


def _widen(g: Graph, x: str, rows: int, size: int, zp: int) -> str:
    return g.rescale(x, [1, rows, size], np.int8, np.int32, [1 << 30], [30], in_zp=zp, out_zp=0)


def sliced_widen(rows: int = 4, channels: int = 32) -> Graph:
    """int8 x[..., C/2:] -> RESCALE to int32 -> ADD 7: the RESCALE cannot fuse into an ADD with a constant."""
    g = Graph()
    x = g.input([1, rows, channels], np.int8)
    half = channels // 2
    wide = _widen(g, _slice(g, x, rows, half, half), rows, half, 4)
    g.op(ts.Op.ADD, [wide, g.const(np.full((1, 1, 1), 7, np.int32))], [1, rows, half], np.int32, attr("Add"),
         output=True)
    return g


def sliced_channel_rescale(rows: int = 20, channels: int = 100) -> Graph:
    """A per-channel RESCALE, its two channel halves widened and compared (a softmax's row max, one level)."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = g.input([1, rows, channels], np.int8)
    t = g.rescale(x, [1, rows, channels], np.int8, np.int8, rng.integers(1 << 30, (1 << 31) - 1, channels).tolist(),
                  rng.integers(30, 33, channels).tolist(), in_zp=-3, out_zp=4)
    half = channels // 2
    lo, hi = (_widen(g, _slice(g, t, rows, s, half), rows, half, 4) for s in (0, half))
    g.op(ts.Op.MAXIMUM, [lo, hi], [1, rows, half], np.int32, attr("Maximum", ts.NanPropagationMode.PROPAGATE),
         output=True)
    return g


def _compile(g: Graph, accelerator: str):
    with tempfile.TemporaryDirectory() as tmp:
        return load_raw(vela_raw(g.serialize(), Path(tmp), accelerator))


def test_vela_drops_a_slice_before_an_unfused_int32_rescale_on_u55():
    g = sliced_widen()
    with pytest.raises(StageError, match="feature map write outside its region"):
        run(_compile(g, "ethos-u55-128"), tosa_inputs(g.io, 0))
    xs = tosa_inputs(g.io, 0)  # the graph itself is fine, and U85 runs it right
    assert np.array_equal(run(_compile(g, "ethos-u85-256"), xs).outputs[0].reshape(4, 16),
                          reference(g.serialize(), xs)[0].reshape(4, 16))


def test_vela_scales_every_slice_of_a_per_channel_rescale_with_the_first_channels():
    g = sliced_channel_rescale()
    model = _compile(g, "ethos-u85-256")
    xs = tosa_inputs(g.io, 0)
    want = reference(g.serialize(), xs)[0].reshape(20, 50)
    assert not np.array_equal(run(model, xs).outputs[0].reshape(20, 50), want)
    model55 = _compile(g, "ethos-u55-128")  # the command stream says so itself: two slices, one scale stream
    pools = [c for c in decode(model55.commands, "x") if c.kind == "POOL" and not c.regs["OFM_PRECISION"] >> 8 & 1]
    assert len(pools) == 2
    assert len({c.addr("IFM_BASE0") for c in pools}) == 2 and len({c.addr("SCALE_BASE") for c in pools}) == 1


def channel_gain_softmax(rows: int = 20, channels: int = 100) -> onnx.ModelProto:
    """A Mul by a constant per channel (a per-channel RESCALE in int8), then a softmax over those channels."""
    gain = numpy_helper.from_array(np.random.default_rng(0).uniform(0.5, 2.0, channels).astype(np.float32), "gain")
    nodes = [helper.make_node("Mul", ["x", "gain"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "gain_softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, channels])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, channels])], [gain])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_a_softmax_after_a_channel_gain_is_bit_exact(accelerator):
    """The softmax's exponent path (CLZ, LOGICAL_LEFT_SHIFT, the reciprocal) after a per-channel gain whose
    output the row max slices: bit-exact on every family (77/6000 outputs differed before the lowering's fix)."""
    compile_and_check(channel_gain_softmax(), [1, 20, 100], accelerator)


def sliced_row_widen(dtype=np.int16, rows: int = 25, channels: int = 192) -> Graph:
    """x[2] of x [rows, 1, C] -> RESHAPE [1, C] -> RESCALE to int32 (not the ADD's fused form) + y -> int16."""
    g = Graph()
    x, y = g.input([rows, 1, channels], dtype), g.input([1, channels], dtype)
    row = g.op(ts.Op.SLICE, [x, g.shape([2, 0, 0]), g.shape([1, 1, channels])], [1, 1, channels], dtype,
               attr("Slice"))
    flat = g.op(ts.Op.RESHAPE, [row, g.shape([1, channels])], [1, channels], dtype, attr("Reshape"))
    a = g.rescale(flat, [1, channels], dtype, np.int32, [1518500250], [23])
    b = g.rescale(y, [1, channels], dtype, np.int32, [1 << 30], [22])
    total = g.op(ts.Op.ADD, [a, b], [1, channels], np.int32, attr("Add"))
    g.rescale(total, [1, channels], np.int32, dtype, [1 << 30], [31], output=True)
    return g


def test_vela_loses_a_sliced_row_before_an_unfused_rescale_on_u55():
    g = sliced_row_widen()
    xs = tosa_inputs(g.io, 0)
    want = reference(g.serialize(), xs)[0].reshape(-1)
    assert not np.array_equal(run(_compile(g, "ethos-u55-128"), xs).outputs[0].reshape(-1), want)
    assert np.array_equal(run(_compile(g, "ethos-u85-256"), xs).outputs[0].reshape(-1), want)


def two_slices_of_a_wide_rescale(clamp: bool, dtype=np.int16) -> Graph:
    """int32 t [1, 96] -> RESCALE to int16 -> (CLAMP) -> SLICE [0:48] and [48:96] -> r*h, then z*(r*h)."""
    g = Graph()
    t, h = g.input([1, 96], np.int32), g.input([1, 48], dtype)
    x = g.rescale(t, [1, 96], np.int32, dtype, [1 << 30], [46])
    if clamp:
        info = np.iinfo(dtype)
        x = g.op(ts.Op.CLAMP, [x], [1, 96], dtype,
                 attr("Clamp", ts.TosaSerializer.convertDataToUint8Vec(ts.DType.INT16, np.array([info.min], dtype)),
                      ts.TosaSerializer.convertDataToUint8Vec(ts.DType.INT16, np.array([info.max], dtype)),
                      ts.NanPropagationMode.PROPAGATE))
    z, r = (g.op(ts.Op.SLICE, [x, g.shape([0, s]), g.shape([1, 48])], [1, 48], dtype, attr("Slice")) for s in (0, 48))

    def mul(a: str, b: str) -> str:
        p = g.op(ts.Op.MUL, [a, b, g.const(np.zeros([1], np.int8))], [1, 48], np.int32, attr("Mul"))
        return g.rescale(p, [1, 48], np.int32, dtype, [1 << 30], [45], output=True)

    mul(z, mul(r, h))
    return g


def test_vela_rescales_every_slice_of_a_wide_rescale_from_channel_0_on_u55():
    g = two_slices_of_a_wide_rescale(clamp=False)
    with pytest.raises(StageError, match="feature map write outside its region"):
        run(_compile(g, "ethos-u55-128"), tosa_inputs(g.io, 0))
    fixed = two_slices_of_a_wide_rescale(clamp=True)  # the lowering's U55/U65 form: three NPU ops, right
    for seed in (0, 1):
        xs = tosa_inputs(fixed.io, seed)
        got, want = run(_compile(fixed, "ethos-u55-128"), xs).outputs, reference(fixed.serialize(), xs)
        assert all(np.array_equal(a.reshape(-1), b.reshape(-1)) for a, b in zip(got, want, strict=True))


def concat_after_a_wide_rescale(clamp: bool, dtype=np.int16) -> Graph:
    """CONCAT(a, RESCALE(int32 t) [-> CLAMP]) over channels: the RESCALE's result goes to channels 8..15."""
    g = Graph()
    t, a = g.input([1, 4, 4, 8], np.int32), g.input([1, 4, 4, 8], dtype)
    r = g.rescale(t, [1, 4, 4, 8], np.int32, dtype, [1 << 30], [46])
    if clamp:
        info = np.iinfo(dtype)
        r = g.op(ts.Op.CLAMP, [r], [1, 4, 4, 8], dtype,
                 attr("Clamp", ts.TosaSerializer.convertDataToUint8Vec(ts.DType.INT16, np.array([info.min], dtype)),
                      ts.TosaSerializer.convertDataToUint8Vec(ts.DType.INT16, np.array([info.max], dtype)),
                      ts.NanPropagationMode.PROPAGATE))
    g.op(ts.Op.CONCAT, [a, r], [1, 4, 4, 16], dtype, attr("Concat", 3), output=True)
    return g


def test_vela_writes_a_wide_rescale_at_channel_0_of_a_concat_on_u55():
    for clamp in (False, True):
        g = concat_after_a_wide_rescale(clamp)
        xs = tosa_inputs(g.io, 0)
        got = run(_compile(g, "ethos-u55-128"), xs).outputs[0].reshape(16, 16)
        want = reference(g.serialize(), xs)[0].reshape(16, 16)
        assert np.array_equal(got, want) == clamp  # wrong without the CLAMP, right with it
