"""Integer and bool graph inputs (an embedding's token ids, an attention mask): what random samples they take,
and a model with each building end to end (its Gather / Where on the host, the rest on the NPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import compile_builds
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError
from npubuild.ethosu.families import check_feeds
from npubuild.frontend.data import calibration_arrays, integer_ranges, load_arrays, random_arrays
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord

ROWS = 50  # the embedding table's vocabulary


def embedding_model(index_type: int = TensorProto.INT64) -> onnx.ModelProto:
    """ids [1, 12] -> Gather (a [50, 16] table) -> mean over the tokens -> Gemm to 4 logits."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(ROWS, 16)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.normal(size=(4, 16)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed", axis=0),
             helper.make_node("ReduceMean", ["emb"], ["pooled"], name="pool", axes=[1], keepdims=0),
             helper.make_node("Gemm", ["pooled", "w", "b"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "embedding", [helper.make_tensor_value_info("ids", index_type, [1, 12])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [table, w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mask_model() -> onnx.ModelProto:
    """x [1, 8, 16] with the rows a bool mask [1, 8, 1] turns off set to 0, mean over rows, Gemm to 3 logits."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32) * 0.3, "w")
    zero = numpy_helper.from_array(np.zeros(1, np.float32), "zero")
    nodes = [helper.make_node("Where", ["mask", "x", "zero"], ["kept"], name="where"),
             helper.make_node("ReduceMean", ["kept"], ["pooled"], name="pool", axes=[1], keepdims=0),
             helper.make_node("Gemm", ["pooled", "w"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
                                                helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 8, 1])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], [w, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_token_ids_take_the_table_rows_a_mask_0_1_other_integers_the_calibration_range():
    model = embedding_model()
    extra = helper.make_tensor_value_info("count", TensorProto.INT32, [1, 1])
    model.graph.input.append(extra)
    model.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1]))
    assert integer_ranges(model) == {"ids": (0, ROWS - 1), "count": (-1, 1), "mask": (0, 1)}
    assert integer_ranges(model, -3.5, 7.9)["count"] == (-3, 7)


def test_a_table_behind_dequantize_linear_counts_its_rows_too():
    """The QDQ model the lower stage checks holds the table as DequantizeLinear(int8 initializer)."""
    model = embedding_model()
    g = model.graph
    table = next(i for i in g.initializer if i.name == "table")
    g.initializer.remove(table)
    g.initializer.extend([numpy_helper.from_array(np.zeros((ROWS, 16), np.int8), "table_q"),
                          numpy_helper.from_array(np.array(0.01, np.float32), "s"),
                          numpy_helper.from_array(np.array(0, np.int8), "z")])
    g.node.insert(0, helper.make_node("DequantizeLinear", ["table_q", "s", "z"], ["table"], name="dq"))
    assert integer_ranges(model) == {"ids": (0, ROWS - 1)}


def test_ids_cast_to_int64_before_the_gather_take_the_rows_too():
    model = embedding_model(TensorProto.INT32)
    model.graph.node.insert(0, helper.make_node("Cast", ["ids"], ["ids64"], name="to_int64", to=TensorProto.INT64))
    model.graph.node[1].input[1] = "ids64"
    assert integer_ranges(model) == {"ids": (0, ROWS - 1)}


def test_an_index_into_another_axis_or_a_computed_table_takes_the_plain_range():
    model = embedding_model()
    model.graph.node[0].attribute[0].i = 1  # Gather along axis 1: not rows of the table
    assert integer_ranges(model)["ids"] == (-1, 1)


def test_random_samples_of_token_ids_cover_the_vocabulary_in_the_input_dtype():
    model = embedding_model()
    cal = calibration_arrays(model, {"random": {"samples": 32, "seed": 0, "low": -1.0, "high": 1.0}}, None)
    ids = cal["ids"]
    assert ids.dtype == np.int64 and ids.shape == (32, 1, 12)
    assert ids.min() >= 0 and ids.max() <= ROWS - 1
    assert len(np.unique(ids)) > ROWS // 2  # a uniform float cast to int64 gave row 0 for every token
    again = random_arrays(model, 32, 0, -1.0, 1.0)["ids"]
    np.testing.assert_array_equal(ids, again)


def test_a_user_array_for_a_bool_input_must_hold_0_and_1(tmp_path: Path):
    x = np.zeros((2, 1, 8, 16), np.float32)
    good = tmp_path / "good.npz"
    np.savez(good, x=x, mask=np.array([[[[1], [0]] * 4]] * 2, np.float32).reshape(2, 1, 8, 1))
    arrays = load_arrays(good, mask_model())
    assert arrays["mask"].dtype == np.bool_ and arrays["mask"].sum() == 8
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x, mask=np.full((2, 1, 8, 1), 0.5, np.float32))
    with pytest.raises(InputError, match="'mask' has values other than 0 and 1"):
        load_arrays(bad, mask_model())


def test_partition_check_feeds_integers_for_integer_inputs_and_floats_for_the_rest():
    io = LowerRecord("int", (IOSpec("ids", "", (1, 12), (0, 1), "int64"), IOSpec("x", "x-0", (1, 4), (0, 1), "int8", 0.05, 0)),
                     (), (), {})
    first = check_feeds(io, integers={"ids": (0, ROWS - 1)})[0]
    assert first["ids"].dtype == np.int64 and 0 <= first["ids"].min() and first["ids"].max() <= ROWS - 1
    assert first["x"].dtype == np.float32 and np.abs(first["x"]).max() <= 0.05 * 128


@pytest.mark.parametrize("make, host_node", [(embedding_model, "embed"), (mask_model, "where")])
def test_a_model_with_an_integer_or_bool_input_builds_with_that_op_on_the_host(make, host_node, tmp_path: Path,
                                                                                capsys):
    path = tmp_path / "model.onnx"
    onnx.save(make(), path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    assert build["status"] == "passed"
    m = build["metrics"]
    assert m["host_ops"] >= 1 and m["npu_ops"] >= 1
    assert m["tosa_max_error_lsb"] is not None and m["tosa_max_error_lsb"] <= 1
    placement = json.loads(next((tmp_path / "b" / "stages" / "lower").glob("*/io.json")).read_text())
    host_nodes = {n for p in placement["families"]["u55"]["partitions"] if p["kind"] == "host" for n in p["nodes"]}
    assert host_node in host_nodes
