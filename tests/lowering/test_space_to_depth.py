"""A stride-2 conv of a 1-channel input at stride 1 on its 2x2 space-to-depth view (lowering/space_to_depth.py).

The view (a one-hot 2x2 stride-2 CONV2D, or a PAD and TRANSPOSE) and its kernel must give the same integers as
the direct conv (TOSA reference model, onnxruntime, npu-sim) for every padding and odd or even side, and be
faster on U55/U65, which take it; U65 measures which view per model, U85 whether to take the conv view at all
(ethosu/measured).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run
from onnx import helper

from npubuild.config.accelerator import FAMILIES
from npubuild.ethosu.measured import choose, one_channel_strided_stems, vela_figures
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa


def _stem(h: int, w: int, kernel: tuple[int, int], pads: list[int], channels: int = 1) -> onnx.ModelProto:
    """A DS-CNN-style stem: a stride-2 conv of a `channels`-channel spectrogram to 64 channels, then Relu."""
    wt = np.random.default_rng(0).standard_normal((64, channels, *kernel)).astype(np.float32) * 0.3
    conv = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=list(kernel), strides=[2, 2], pads=pads)
    oh = (h + pads[0] + pads[2] - kernel[0]) // 2 + 1
    ow = (w + pads[1] + pads[3] - kernel[1]) // 2 + 1
    return model_of([conv, helper.make_node("Relu", ["c"], ["y"])], {"x": [1, channels, h, w]},
                    {"y": [1, 64, oh, ow]}, {"w": wt})


def _direct(family: str):
    return replace(FAMILY_OPTIONS[family], space_to_depth_channels=None)


def _convs(g) -> int:
    return ops(g).count("CONV2D")


def _stem_kernel(g) -> tuple[int, int]:
    """The (kh, kw) of the graph's last CONV2D (the stem, after its view)."""
    graph = read_tosa(g.tosa)
    conv = [op for op in graph.ops if op.op == "CONV2D"][-1]
    return graph.tensors[conv.inputs[1]].shape[1:3]


def _viewed(g) -> bool:
    """Whether the stem runs on a space-to-depth view: a one-hot conv before it, or a TRANSPOSE."""
    return _convs(g) == 2 or "TRANSPOSE" in ops(g)


# DS-CNN's stem (odd H, asymmetric pads), an even input with symmetric pads, odd kernel and no padding,
# and pads that leave the last input row unread by the original conv's floor
@pytest.mark.parametrize("by_conv", [True, False])
@pytest.mark.parametrize("h,w,kernel,pads", [(49, 10, (10, 4), [4, 1, 5, 2]), (32, 32, (3, 3), [1, 1, 1, 1]),
                                             (15, 9, (3, 5), [0, 0, 0, 0]), (16, 16, (3, 3), [1, 1, 0, 0])])
def test_view_gives_the_same_integers(h, w, kernel, pads, by_conv):
    shape = [1, 1, h, w]
    model = _stem(h, w, kernel, pads)
    cal = calib("x", shape)
    folded, _ = check_int(model, cal, {"x": np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32)},
                          options=replace(FAMILY_OPTIONS["u55"], space_to_depth_conv=by_conv))
    direct = lower_model(quantize_model(model, cal), "int", options=_direct("u55"))
    assert _convs(direct) == 1 and "TRANSPOSE" not in ops(direct)
    if by_conv:  # the view is a conv of its own, with no data movement op, and starts early where a leading
        # pad is odd, so the stem's kernel is ceil(k / 2) blocks a side: no extra taps for the block grid's shift
        assert _convs(folded) == 2 and not {"TRANSPOSE", "PAD"} & set(ops(folded))
        assert _stem_kernel(folded) == (-(-kernel[0] // 2), -(-kernel[1] // 2))
    else:
        assert _convs(folded) == 1 and "TRANSPOSE" in ops(folded)
    assert_same_reference(direct, folded)


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256")])
def test_view_is_faster_where_taken(family, target):
    qdq = quantize_model(_stem(49, 10, (10, 4), [4, 1, 5, 2]), calib("x", [1, 1, 49, 10]))
    folded, direct = lower_model(qdq, "int", family=family), lower_model(qdq, "int", options=_direct(family))
    assert _viewed(folded) and not _viewed(direct)
    assert vela_run(folded.tosa, target).cycles < 0.9 * vela_run(direct.tosa, target).cycles


def test_view_bitexact_on_npusim():
    qdq = quantize_model(_stem(49, 10, (10, 4), [4, 1, 5, 2]), calib("x", [1, 1, 49, 10]))
    folded = lower_model(qdq, "int", family="u55")
    assert _convs(folded) == 2
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(folded.tosa, io_dict(folded), vela_raw(folded.tosa, Path(tmp), "ethos-u55-128"))


@pytest.mark.parametrize("family,channels", [("u85", 1), ("u55", 3)])
def test_u85_and_image_stems_convolve_directly(family, channels):
    """U85's own options convolve directly (the lower stage measures the view there), and a 3-channel image's
    view costs more than it saves everywhere."""
    qdq = quantize_model(_stem(64, 64, (3, 3), [1, 1, 1, 1], channels), calib("x", [1, channels, 64, 64]))
    lowered = lower_model(qdq, "int", family=family)
    assert lowered.tosa == lower_model(qdq, "int", options=_direct(family)).tosa
    assert not _viewed(lowered)


def _measured(qdq: onnx.ModelProto, family: str, forms: list, choice: str):
    """The options the lower stage's measurement gives `family`, after checking its record of `choice`: Vela's
    figures for `forms` (the family's own lowering, then the variant), and the faster one taken."""
    figures = [vela_figures(g.tosa, FAMILIES[family].measured_on) for g in forms]
    options, record = choose(qdq, family, lambda o: lower_model(qdq, "int", options=o))
    (entry,) = [r for r in record if r["choice"] == choice]
    assert entry["figures"] == figures
    assert entry["taken"] == int(figures[1]["ms"] < figures[0]["ms"])
    return options, bool(entry["taken"])


def test_u85_measures_the_view_per_model():
    """U85 takes the conv view where Vela estimates it faster for this model; U55 has it in its options already,
    and a 3-channel stem is not a candidate."""
    qdq = quantize_model(_stem(49, 10, (10, 4), [4, 1, 5, 2]), calib("x", [1, 1, 49, 10]))
    assert one_channel_strided_stems(qdq)
    assert not one_channel_strided_stems(quantize_model(_stem(32, 32, (3, 3), [1, 1, 1, 1], 3),
                                                        calib("x", [1, 3, 32, 32])))
    own = FAMILY_OPTIONS["u85"]
    forms = [lower_model(qdq, "int", options=o)
             for o in (own, replace(own, space_to_depth_channels=1, space_to_depth_conv=True))]
    assert [_convs(g) for g in forms] == [1, 2]
    assert_same_reference(forms[0], forms[1])
    name = "1-channel stride-2 stem on its space-to-depth view"
    options, taken = _measured(qdq, "u85", forms, name)
    assert (options.space_to_depth_channels == 1) == taken
    _, u55 = choose(qdq, "u55", lambda o: lower_model(qdq, "int", options=o))
    assert all(r["choice"] != name for r in u55)


def test_u65_measures_which_view_per_model():
    """U65 makes the view by a TRANSPOSE unless Vela estimates the one-hot conv faster for this model."""
    qdq = quantize_model(_stem(49, 10, (10, 4), [4, 1, 5, 2]), calib("x", [1, 1, 49, 10]))
    own = FAMILY_OPTIONS["u65"]
    forms = [lower_model(qdq, "int", options=o) for o in (own, replace(own, space_to_depth_conv=True))]
    assert "TRANSPOSE" in ops(forms[0]) and _convs(forms[1]) == 2
    assert_same_reference(forms[0], forms[1])
    options, taken = _measured(qdq, "u65", forms, "space-to-depth view as a one-hot conv")
    assert options.space_to_depth_conv == taken
