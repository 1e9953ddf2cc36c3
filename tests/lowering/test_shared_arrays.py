"""A model's initializers are read-only arrays in every lowering, converted once for all lowerings of that model
(ModelArrays): an op lowering that writes into one fails, sharing them changes no graph, and a model that is not
the one they were made from (concat_order's reordered copy, another model) converts its own. concat_order's
analysis is the lowering's graph index when no Concat moves."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from npbtest.lowering import downsampling_block, models  # noqa: F401  (models: fixture)
from npbtest.ops import calib, quantize_model, single_op_model

from npubuild.errors import InternalError
from npubuild.frontend import concat_order
from npubuild.frontend.graph_index import GraphIndex
from npubuild.lowering import load_all
from npubuild.lowering.context import LoweringContext, ModelArrays
from npubuild.lowering.driver import lower_model
from npubuild.lowering.registry import LOWERINGS, op_key


@pytest.fixture(scope="module")
def block() -> onnx.ModelProto:
    return quantize_model(downsampling_block(8, 16, 8), calib("x", [1, 8, 8, 8], n=8))


def test_initializers_are_read_only_and_shared(block) -> None:
    arrays = ModelArrays.of(block)
    assert arrays.arrays and all(not a.flags.writeable for a in arrays.arrays.values())
    ctx = LoweringContext(block, "int", shared=arrays.for_model(block))
    assert all(ctx.values[name] is a for name, a in arrays.arrays.items())
    fresh = LoweringContext(block, "int")  # converted here, read-only all the same
    assert all(not fresh.values[name].flags.writeable for name in arrays.arrays)
    with pytest.raises(ValueError, match="read-only"):
        next(iter(arrays.arrays.values()))[...] = 0


def test_a_lowering_writing_into_an_initializer_fails(block, monkeypatch) -> None:
    arrays = ModelArrays.of(block)
    before = {name: a.copy() for name, a in arrays.arrays.items()}
    load_all()
    conv = LOWERINGS[op_key("", "Conv")]

    def writing(ctx: LoweringContext) -> None:
        weights = ctx.index.producer[ctx.current.input[1]].input[0]  # the int8 weights behind the DequantizeLinear
        ctx.values[weights][...] = 0
        conv(ctx)

    monkeypatch.setitem(LOWERINGS, op_key("", "Conv"), writing)
    with pytest.raises(InternalError, match="read-only"):
        lower_model(block, "int", arrays=arrays)
    with pytest.raises(InternalError, match="read-only"):
        lower_model(block, "int")  # its own arrays are read-only too
    assert all(np.array_equal(before[name], a) for name, a in arrays.arrays.items())


@pytest.mark.parametrize("family", [None, "u55", "u65", "u85"])
def test_shared_arrays_lower_to_the_same_graph(block, models, family) -> None:  # noqa: F811
    _, _, unet = models  # its Concat moves on the concat_order families: that copy converts its own arrays
    for model in (block, unet):
        arrays = ModelArrays.of(model)
        shared = [lower_model(model, "int", family=family, arrays=arrays) for _ in range(2)]
        fresh = lower_model(model, "int", family=family)
        assert shared[0].tosa == shared[1].tosa == fresh.tosa
        assert shared[0].node_ops == fresh.node_ops


def test_arrays_of_another_model_are_not_used(block) -> None:
    other = copy.deepcopy(block)
    weights = next(i for i in other.graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 4)
    changed = onnx.numpy_helper.to_array(weights).copy()
    changed.flat[0] = 1 - changed.flat[0]
    weights.CopyFrom(onnx.numpy_helper.from_array(changed, weights.name))
    arrays = ModelArrays.of(other)
    assert arrays.for_model(block) is None
    assert lower_model(block, "int", arrays=arrays).tosa == lower_model(block, "int").tosa
    assert lower_model(other, "int", arrays=arrays).tosa != lower_model(block, "int").tosa


def test_reordered_copies_only_a_model_whose_concat_moves(models) -> None:  # noqa: F811
    _, _, unet = models
    kept = unet.SerializeToString()
    moved, index = concat_order.reordered(unet)
    assert moved is not unet and index is None and unet.SerializeToString() == kept
    assert moved.SerializeToString() == concat_order.copied_inputs_first(unet).SerializeToString()

    shape = [1, 4, 8, 8]  # a Concat of two graph inputs: both copied already, nothing moves
    cat = quantize_model(single_op_model("Concat", {"a": shape, "b": shape}, {"y": None}, {}, axis=1),
                         {**calib("a", shape, n=4), **calib("b", shape, n=4)})
    same, index = concat_order.reordered(cat)
    assert same is cat and index is not None
    fresh = GraphIndex(cat)
    assert index.producer == fresh.producer and index.consumers == fresh.consumers and index.order == fresh.order
    assert lower_model(cat, "int", family="u55").tosa == lower_model(cat, "int", family="u55",
                                                                     arrays=ModelArrays.of(cat)).tosa


def test_qparams_are_read_once_for_every_lowering(block) -> None:
    arrays = ModelArrays.of(block)
    first = lower_model(block, "int", family="u55", arrays=arrays)
    assert arrays.qparams and all(q.scale.flags.writeable is False and q.zero_point.flags.writeable is False
                                  for _, q in arrays.qparams.values())
    ctx = LoweringContext(block, "int", shared=arrays)
    for node, q in arrays.qparams.values():
        assert ctx.qparams_of(node) is q
        with pytest.raises(ValueError, match="read-only"):
            q.scale[...] = 1.0
    again = lower_model(block, "int", family="u55", arrays=arrays)
    assert first.tosa == again.tosa == lower_model(block, "int", family="u55").tosa
    with pytest.raises(AssertionError, match="another model"):
        LoweringContext(copy.deepcopy(block), "int", shared=arrays)
