"""Shape and data-movement ops, FP and INT against onnxruntime, each INT case compiled by Vela for U55 and U85.

Pure data movement must be bit exact in int8 (max_lsb=0); only linear Resize
rounds (onnxruntime rounds halves to even, TOSA up), so it is allowed 1 LSB.
Layout is checked too: no TRANSPOSE where the model's semantics need none.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.ops import (
    calib,
    check_fp,
    check_int,
    prepare,
    quantize_model,
    rand,
    run_onnx,
    single_op_model,
    vela_op_counts,
)
from onnx import TensorProto, helper

from npubuild.ethosu.support import check_node
from npubuild.lowering.driver import lower_model
from npubuild.records.lower import Where
from npubuild.tosa.graph import CONST_OPS, read_tosa
from npubuild.tosa.run import run_tosa

ACCELS = ("ethos-u55-128", "ethos-u85-256")
BIG = np.iinfo(np.int64).max
EMPTY = np.array([], np.float32)


def ops_of(lowered) -> list[str]:
    return [op for ops in lowered.node_ops.values() for op in ops]


def _model(nodes, inputs: dict[str, list[int]], outputs: list[str], inits: dict | None = None,
           opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in model.graph.output:
        out.CopyFrom(known[out.name])
    return model


def wrapped(op: str, shape: list[int], inits: dict | None = None, opset: int = 18, out_rank: int | None = None,
            **attrs) -> onnx.ModelProto:
    """x -> Transpose(identity) -> op -> Transpose(identity) -> y.

    onnxruntime leaves ops it has no QDQ rule for (DepthToSpace, Tile, Expand, Cast...) in float;
    the identity Transposes around them get Q/DQ pairs, as real neighbours would, and cost no operator.
    """
    inits = inits or {}
    ident = list(range(len(shape)))
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], perm=ident, name="pre"),
             helper.make_node(op, ["t0", *inits], ["t1"], name="the_op", **attrs),
             helper.make_node("Transpose", ["t1"], ["y"], perm=list(range(out_rank or len(shape))), name="post")]
    return _model(nodes, {"x": shape}, ["y"], inits, opset)


def check_op(model: onnx.ModelProto, shapes: dict[str, list[int]], max_lsb: float = 0, vela: dict | None = None):
    """FP and INT checks, then Vela for U55 and U85: every op on the NPU unless `vela` says Vela rejects it there."""
    feeds = {k: rand(s, 1 + i) for i, (k, s) in enumerate(shapes.items())}
    cal: dict[str, np.ndarray] = {}
    for i, (k, s) in enumerate(shapes.items()):  # different ranges -> different int8 scales per input
        cal.update(calib(k, s, seed=100 + i, low=-1.0 - i, high=1.0 + i))
    check_fp(model, feeds)
    lowered, _ = check_int(model, cal, feeds, max_lsb=max_lsb)
    for accel in ACCELS:
        reason = (vela or {}).get(accel)
        if reason is None:
            npu, cpu = vela_op_counts(lowered.tosa, accel)
            assert cpu == 0 and npu >= 1, (accel, npu, cpu)
        else:  # Vela has no CPU fallback for TOSA: an unsupported op is a compile error naming it
            with pytest.raises(AssertionError, match=reason):
                vela_op_counts(lowered.tosa, accel)
    return lowered


def ids(cases):
    return [f"case{i}" for i in range(len(cases))]


# ---------------------------------------------------------------- Reshape family, Transpose

RESHAPES = [
    ("Squeeze", [1, 3, 1, 5], {"a": np.array([2])}, {}),
    ("Squeeze", [1, 3, 1, 1], {}, {}),
    ("Unsqueeze", [1, 3, 4, 5], {"a": np.array([-1])}, {}),
    ("Unsqueeze", [3, 5], {"a": np.array([0, 2])}, {}),
    ("Flatten", [1, 3, 4, 5], {}, {"axis": 2}),
    ("Flatten", [2, 3, 4], {}, {"axis": -1}),
    ("Reshape", [1, 3, 4, 5], {"s": np.array([1, 3, 20])}, {}),
    ("Reshape", [1, 3, 4, 5], {"s": np.array([0, 12, -1])}, {}),
    ("Reshape", [2, 12], {"s": np.array([2, 3, 2, 2])}, {}),
]


@pytest.mark.parametrize("op,shape,inits,attrs", RESHAPES, ids=ids(RESHAPES))
def test_reshape_family(op, shape, inits, attrs):
    model = single_op_model(op, {"x": shape}, {"y": None}, inits, opset=18, **attrs)
    check_op(model, {"x": shape})


TRANSPOSES = [([1, 3, 4, 5], [0, 2, 3, 1]), ([1, 3, 4, 5], [0, 3, 1, 2]), ([1, 3, 4, 5], [0, 2, 1, 3]),
              ([2, 3, 4], [2, 0, 1]), ([3, 5], [1, 0])]


@pytest.mark.parametrize("shape,perm", TRANSPOSES, ids=ids(TRANSPOSES))
def test_transpose_is_a_relabelling(shape, perm):
    """A lone Transpose moves no data: the output is the input's buffer read in another layout."""
    lowered = check_op(single_op_model("Transpose", {"x": shape}, {"y": None}, perm=perm), {"x": shape})
    assert "TRANSPOSE" not in ops_of(lowered)


def test_transpose_where_semantics_need_it():
    """Conv -> Transpose(0,2,1,3) -> Conv swaps H and C for real: one TRANSPOSE, all on the NPU."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(0, .4, (4, 4, 1, 1)).astype(np.float32), rng.normal(0, .4, (3, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Conv", ["t", "w2"], ["y"], kernel_shape=[1, 1])]
    lowered = check_op(_model(nodes, {"x": [1, 4, 3, 5]}, ["y"], {"w1": w1, "w2": w2}, 17), {"x": [1, 4, 3, 5]},
                       max_lsb=1)
    assert ops_of(lowered).count("TRANSPOSE") == 1


# ---------------------------------------------------------------- Concat, Split

CONCATS = [  # (shapes, axis): channel, spatial, batch, rank-3 and rank-2
    ([[1, 2, 3, 4], [1, 3, 3, 4]], 1),
    ([[1, 2, 3, 4], [1, 2, 2, 4], [1, 2, 1, 4]], 2),
    ([[1, 2, 3, 4], [1, 2, 3, 2]], -1),
    ([[2, 3, 4], [2, 3, 5]], 2),
    ([[3, 4], [2, 4]], 0),
]


@pytest.mark.parametrize("shapes,axis", CONCATS, ids=ids(CONCATS))
def test_concat(shapes, axis):
    """Operands have different int8 scales (calibrated on different ranges): they are rescaled to the output's."""
    names = {f"x{i}": s for i, s in enumerate(shapes)}
    model = single_op_model("Concat", names, {"y": None}, axis=axis)
    lowered = check_op(model, names)
    assert "TRANSPOSE" not in ops_of(lowered)
    assert "RESCALE" in ops_of(lowered)


def test_concat_with_constant():
    c = rand([1, 2, 3, 4], 7)
    model = single_op_model("Concat", {"x": [1, 3, 3, 4]}, {"y": None}, {"c": c}, axis=1)
    assert "TRANSPOSE" not in ops_of(check_op(model, {"x": [1, 3, 3, 4]}))


SPLITS = [  # (shape, axis, split sizes input or None, num_outputs attr or None, n outputs, opset)
    ([1, 6, 3, 4], 1, [2, 4], None, 2, 18),
    ([1, 6, 3, 4], 1, None, 3, 3, 18),
    ([1, 2, 7, 4], 2, None, 2, 2, 18),
    ([1, 2, 3, 8], -1, None, None, 2, 13),
    ([4, 6], 0, [1, 3], None, 2, 13),
]


@pytest.mark.parametrize("shape,axis,sizes,num,n,opset", SPLITS, ids=ids(SPLITS))
def test_split(shape, axis, sizes, num, n, opset):
    attrs = {"axis": axis, **({"num_outputs": num} if num else {})}
    inits = {"s": np.array(sizes, np.int64)} if sizes else {}
    model = single_op_model("Split", {"x": shape}, {f"y{i}": None for i in range(n)}, inits, opset=opset, **attrs)
    lowered = check_op(model, {"x": shape})
    assert "TRANSPOSE" not in ops_of(lowered)


# ---------------------------------------------------------------- Slice, Gather

SLICES = [  # starts, ends, axes, steps
    ([1], [3], [1], None),
    ([-3], [-1], [3], None),
    ([1, 0], [BIG, 3], [2, 3], None),
    ([0], [BIG], [3], [2]),
    ([1], [6], [2], [3]),
    ([-1], [-BIG], [3], [-1]),
    ([4], [0], [2], [-2]),
    ([2], [-BIG], [1], [-1]),
    ([0, 1], [2, 5], [1, 2], [1, 2]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES, ids=ids(SLICES))
def test_slice(starts, ends, axes, steps):
    shape = [1, 3, 6, 7]
    inits = {"s": np.array(starts), "e": np.array(ends), "a": np.array(axes)}
    if steps:
        inits["st"] = np.array(steps)
    model = single_op_model("Slice", {"x": shape}, {"y": None}, inits)
    lowered = check_op(model, {"x": shape})
    assert "TRANSPOSE" not in ops_of(lowered)


GATHERS = [  # (shape, indices, axis)
    ([1, 4, 3, 5], np.array(2), 1),
    ([1, 4, 3, 5], np.array(-1), -1),
    ([1, 4, 3, 5], np.array([0, 2, 3]), 1),
    ([1, 4, 3, 5], np.array([4, 1, 1]), 3),
    ([2, 4, 5], np.array([[0, 1], [3, 2]]), 1),
    ([6, 4], np.array(3), 0),
]


@pytest.mark.parametrize("shape,indices,axis", GATHERS, ids=ids(GATHERS))
def test_gather_constant_indices(shape, indices, axis):
    """Slices of contiguous index runs and a CONCAT: no GATHER, which U55/U65 lack."""
    model = single_op_model("Gather", {"x": shape}, {"y": None}, {"i": indices.astype(np.int64)}, axis=axis)
    lowered = check_op(model, {"x": shape})
    assert "GATHER" not in ops_of(lowered)
    assert "TRANSPOSE" not in ops_of(lowered)


# ---------------------------------------------------------------- Pad

PADS = [  # (mode, pads, constant value, axes)
    ("constant", [0, 0, 1, 2, 0, 0, 2, 1], None, None),
    ("constant", [0, 1, 1, 0, 0, 2, 0, 1], 0.5, None),
    ("constant", [1, 2, 0, 1], None, [2, 3]),
    ("constant", [0, 0, -1, 1, 0, 0, 1, -2], None, None),
    ("reflect", [0, 0, 1, 2, 0, 0, 2, 1], None, None),
    ("edge", [0, 0, 2, 0, 0, 0, 1, 3], None, None),
    ("wrap", [0, 0, 1, 1, 0, 0, 2, 1], None, None),
]


@pytest.mark.parametrize("mode,pads,value,axes", PADS, ids=ids(PADS))
def test_pad(mode, pads, value, axes):
    shape = [1, 2, 4, 5]
    inits = {"p": np.array(pads, np.int64)}
    names = ["x", "p"]
    if value is not None or axes is not None:
        inits["v"] = np.array(value or 0.0, np.float32)
        names.append("v")
    if axes is not None:
        inits["a"] = np.array(axes, np.int64)
        names.append("a")
    model = single_op_model("Pad", {"x": shape}, {"y": None}, inits, opset=19, node_inputs=names, mode=mode)
    lowered = check_op(model, {"x": shape})
    assert "TRANSPOSE" not in ops_of(lowered)


# ---------------------------------------------------------------- Resize

U55_RESIZE = "Resize\\) could not run on NPU"
RESIZES = [  # (attrs, scales or None, sizes or None, max_lsb, U55 runs it)
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 2], None, 0, True),
    ({"mode": "nearest"}, [1, 1, 2, 2], None, 0, True),
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 4, 4], None, 0, True),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "ceil"}, [1, 1, 1.5, 3], None, 0, False),
    ({"mode": "nearest", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 7, 9], 0, False),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, [1, 1, 0.5, 0.5], None, 0, False),
    ({"mode": "linear"}, [1, 1, 2, 2], None, 1, False),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 2], None, 1, False),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 2, 8, 1], 1, False),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 2, 2], None, 1, False),
    ({"mode": "linear"}, [1, 1, 0.5, 0.5], None, 1, False),
]


@pytest.mark.parametrize("attrs,scales,sizes,max_lsb,u55", RESIZES, ids=ids(RESIZES))
def test_resize(attrs, scales, sizes, max_lsb, u55):
    """Vela 5.2 runs TOSA RESIZE on U55/U65 only as 2x/4x pixel replication; U85 runs every case."""
    shape = [1, 2, 4, 6]
    inits = {"roi": EMPTY, "sc": np.array(scales or [], np.float32)}
    if sizes:
        inits["sz"] = np.array(sizes, np.int64)
    model = single_op_model("Resize", {"x": shape}, {"y": None}, inits, **attrs)
    lowered = check_op(model, {"x": shape}, max_lsb=max_lsb, vela=None if u55 else {"ethos-u55-128": U55_RESIZE})
    assert ops_of(lowered).count("RESIZE") == 1 and "TRANSPOSE" not in ops_of(lowered)
    graph = read_tosa(lowered.tosa)
    ops = [o for o in graph.ops if o.op not in CONST_OPS]
    verdict = check_node(ops, graph, "u55")  # the support rule agrees with Vela, so a build puts it on the host
    assert (verdict is None) == u55, verdict
    assert check_node(ops, graph, "u85") is None


@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel"])
def test_bilinear_2x_for_u55_runs_on_the_npu(coord):
    """Lowered for the U55 family, half-pixel bilinear 2x is replication + edge pad + depthwise blur: within
    1 LSB of onnxruntime (it rounds halves to even) and entirely on the U55 NPU."""
    shape = [1, 3, 5, 6]
    model = single_op_model("Resize", {"x": shape}, {"y": None}, {"roi": EMPTY, "sc": np.array([1, 1, 2, 2], np.float32)},
                            mode="linear", coordinate_transformation_mode=coord)
    qdq = quantize_model(model, calib("x", shape))
    lowered = lower_model(qdq, "int", family="u55")
    assert "DEPTHWISE_CONV2D" in ops_of(lowered) and "TRANSPOSE" not in ops_of(lowered)
    feeds = {"x": rand(shape, 3)}
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(qdq, Path(tmp) / "qdq.onnx")
        ref = run_onnx(str(Path(tmp) / "qdq.onnx"), feeds)["y"]
    got = run_tosa(lowered.tosa, lowered, feeds)["y"].astype(np.float64)
    assert np.max(np.abs(lowered.outputs[0].quantize_reference(ref) - got)) <= 1
    assert vela_op_counts(lowered.tosa, "ethos-u55-128")[1] == 0


# ---------------------------------------------------------------- ops onnxruntime leaves in float

FLOAT_OPS = [  # (op, shape, inits, attrs, expected TRANSPOSE count)
    ("DepthToSpace", [1, 8, 3, 4], {}, {"blocksize": 2, "mode": "DCR"}, 1),
    ("DepthToSpace", [1, 8, 3, 4], {}, {"blocksize": 2, "mode": "CRD"}, 1),
    ("DepthToSpace", [1, 9, 2, 2], {}, {"blocksize": 3}, 1),
    ("SpaceToDepth", [1, 2, 4, 6], {}, {"blocksize": 2}, 1),
    ("Tile", [1, 2, 3, 4], {"r": np.array([1, 2, 1, 3])}, {}, 0),
    ("Tile", [3, 4], {"r": np.array([2, 1])}, {}, 0),
    ("Expand", [1, 2, 1, 4], {"r": np.array([2, 1, 3, 1])}, {}, 0),
    ("Expand", [3, 1], {"r": np.array([1, 2, 3, 4])}, {"out_rank": 4}, 0),
    ("Cast", [1, 2, 3, 4], {}, {"to": TensorProto.FLOAT}, 0),
]


@pytest.mark.parametrize("op,shape,inits,attrs,n_transpose", FLOAT_OPS, ids=ids(FLOAT_OPS))
def test_ops_between_quantized_neighbours(op, shape, inits, attrs, n_transpose):
    lowered = check_op(wrapped(op, shape, inits, **attrs), {"x": shape})
    assert ops_of(lowered).count("TRANSPOSE") == n_transpose


# ---------------------------------------------------------------- no TRANSPOSE where none is needed

def _conv(name: str, x: str, y: str, cin: int, cout: int, seed: int, inits: dict) -> onnx.NodeProto:
    inits[name] = np.random.default_rng(seed).normal(0, 0.4, (cout, cin, 3, 3)).astype(np.float32)
    return helper.make_node("Conv", [x, name], [y], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


def test_cnn_concat_pool_flatten_has_no_transpose():
    """Two conv branches concatenated on channels, global pool, Flatten, Gemm: NHWC all the way."""
    inits: dict = {"fc": np.random.default_rng(3).normal(0, 0.3, (3, 7)).astype(np.float32)}
    nodes = [_conv("w1", "x", "a", 2, 3, 1, inits), _conv("w2", "x", "b", 2, 4, 2, inits),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"], axis=1),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    lowered = check_op(_model(nodes, {"x": [1, 2, 6, 6]}, ["y"], inits, 17), {"x": [1, 2, 6, 6]}, max_lsb=1)
    assert "TRANSPOSE" not in ops_of(lowered)


def test_layout_round_trip_and_patch_flatten_cost_nothing():
    """Conv -> NHWC Transpose -> back to NCHW -> Conv, then the ViT patch flatten (Reshape to [1, C, HW],
    Transpose(0, 2, 1)) feeding a Gemm: the ONNX Transposes only convert layouts, so no TRANSPOSE is emitted."""
    inits: dict = {"fc": np.random.default_rng(4).normal(0, 0.3, (3, 5)).astype(np.float32),
                   "s1": np.array([1, 3, 16]), "s2": np.array([16, 3])}
    nodes = [_conv("w1", "x", "a", 2, 4, 1, inits),
             helper.make_node("Transpose", ["a"], ["nhwc"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["nhwc"], ["nchw"], perm=[0, 3, 1, 2]),
             _conv("w2", "nchw", "b", 4, 3, 2, inits),
             helper.make_node("Reshape", ["b", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["tokens"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["tokens", "s2"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc"], ["y"])]
    lowered = check_op(_model(nodes, {"x": [1, 2, 4, 4]}, ["y"], inits, 17), {"x": [1, 2, 4, 4]}, max_lsb=1)
    assert "TRANSPOSE" not in ops_of(lowered)


# ---------------------------------------------------------------- folded at import, or gone

def test_torch_shape_chain_folds_and_lowers():
    """x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    inits = {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    model = _model(nodes, {"x": [1, 3, 4, 4]}, ["y"], inits, 17)
    assert [n.op_type for n in prepare(model).graph.node] == ["Reshape"]
    check_op(model, {"x": [1, 3, 4, 4]})


def _fp_without_import(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[str]:
    """Lower a float model as given (no import passes) and compare with onnxruntime."""
    lowered = lower_model(model, "fp")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, path)
        ref = run_onnx(str(path), feeds)
    got = run_tosa(lowered.tosa, lowered, feeds)
    for name, r in ref.items():
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5)
    return ops_of(lowered)


def test_identity_dropout_constant_cast_lower_without_import_passes():
    """The import stage removes these; the lowerings still handle them for graphs that skip it."""
    value = helper.make_tensor("v", TensorProto.INT64, [2], [1, -1])
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Dropout", ["i"], ["d"]),
             helper.make_node("Constant", [], ["shape"], value=value),
             helper.make_node("Cast", ["d"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    model = _model(nodes, {"x": [1, 2, 3, 4]}, ["y"], opset=17)
    ops = _fp_without_import(model, {"x": rand([1, 2, 3, 4], 1)})
    assert ops == ["TRANSPOSE", "RESHAPE"]  # NHWC input to row-major [1, 24]: the one move the semantics need


def test_identity_to_graph_output_is_copied():
    model = single_op_model("Identity", {"x": [2, 3]}, {"y": None})
    assert _fp_without_import(model, {"x": rand([2, 3], 1)}) == ["IDENTITY"]


# ---------------------------------------------------------------- what torch exports

def _torch_model(dynamo: bool) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    nn, fn = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)
            self.c = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            y = torch.cat([self.a(x), self.b(x)], 1)
            y = self.c(fn.pad(y, (1, 1, 1, 1), mode="reflect"))[:, :, 1:-1, 1:-1]
            p, q = torch.chunk(y, 2, dim=1)
            y = fn.interpolate(p + q, scale_factor=2, mode="nearest")
            y = fn.pixel_shuffle(fn.pixel_unshuffle(y, 2), 2)
            y = fn.adaptive_avg_pool2d(y, 1)
            return y.view(y.size(0), -1)

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "net.onnx"
        torch.onnx.export(Net().eval(), (torch.randn(1, 3, 8, 8),), str(path), input_names=["x"], output_names=["y"],
                          opset_version=18, dynamo=dynamo, verbose=False)
        return onnx.load(str(path))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_exported_data_movement(dynamo):
    """cat, reflect pad, slicing, chunk, nearest upsample, pixel (un)shuffle and view(n, -1) as both exporters
    write them: shape chains fold at import, everything runs on the NPU, and TRANSPOSEs are only those the
    pixel (un)shuffles need (one each, whether written as DepthToSpace or as rank-6 Reshape/Transpose)."""
    model = _torch_model(dynamo)
    assert not {"Shape", "Gather", "ConstantOfShape"} & {n.op_type for n in prepare(model).graph.node}
    lowered = check_op(model, {"x": [1, 3, 8, 8]}, max_lsb=1)
    assert ops_of(lowered).count("TRANSPOSE") == 2


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_transposed_dequantized_weight_stays_a_constant(per_channel):
    """Other quantizers write DequantizeLinear(int8 weight) -> Transpose -> MatMul: the Transpose folds at
    compile time (moving a per-channel axis), so the MatMul still gets a constant weight and stays bit exact."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 127, (6, 8)).astype(np.int8)  # [N, K], as torch's Linear stores it
    ws = (rng.uniform(0.005, 0.01, 6) if per_channel else np.array(0.008)).astype(np.float32)
    inits = {"w": w, "ws": ws, "wz": np.zeros(ws.shape, np.int8), "xs": np.array(0.01, np.float32),
             "xz": np.array(3, np.int8), "ys": np.array(0.05, np.float32), "yz": np.array(-2, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xd", "wt"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    model = _model(nodes, {"x": [3, 8]}, ["y"], inits, 17)
    lowered = lower_model(model, "int")
    assert "TRANSPOSE" not in ops_of(lowered) and "CONV2D" in ops_of(lowered)
    feeds = {"x": rand([3, 8], 1)}
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "m.onnx")
        ref = run_onnx(str(Path(tmp) / "m.onnx"), feeds)["y"]
    got = run_tosa(lowered.tosa, lowered, feeds)["y"].astype(np.float64)
    assert np.array_equal(lowered.outputs[0].quantize_reference(ref), got)


def test_u55_family_lowering_keeps_bilinear_resize_on_the_npu():
    """The portable lowering's bilinear RESIZE goes to the host on U55 (the support rule); the U55 family's
    own lowering puts every node on the NPU."""
    from npubuild.ethosu.partition import plan_partitions

    shape = [1, 2, 4, 4]
    model = single_op_model("Resize", {"x": shape}, {"y": None}, {"roi": EMPTY, "sc": np.array([1, 1, 2, 2], np.float32)},
                            mode="linear")
    qdq = quantize_model(model, calib("x", shape))
    portable = plan_partitions(qdq, lower_model(qdq, "int"), "u55")
    assert [p.kind for p in portable.placements.values() if p.node == "the_resize"] == [Where.HOST]
    own = plan_partitions(qdq, lower_model(qdq, "int", family="u55"), "u55")
    assert all(p.kind == "npu" for p in own.placements.values())


FC_HEADS = [("Gemm", {"transB": 1}), ("Gemm", {}), ("MatMul", {})]


@pytest.mark.parametrize("op,attrs", FC_HEADS, ids=["gemm-transB", "gemm", "matmul"])
def test_flatten_into_fully_connected_needs_no_transpose(op, attrs):
    """Conv -> Flatten (spatial > 1) -> Gemm/MatMul: rows are flattened in NHWC order and the constant weight's
    K axis is permuted at compile time instead of transposing the activation."""
    rng = np.random.default_rng(5)
    k, n = 4 * 3 * 3, 5
    inits: dict = {"fc": rng.normal(0, 0.2, (n, k) if attrs.get("transB") else (k, n)).astype(np.float32)}
    nodes = [_conv("w1", "x", "a", 2, 4, 1, inits), helper.make_node("Flatten", ["a"], ["f"], axis=1),
             helper.make_node(op, ["f", "fc"], ["y"], **attrs)]
    lowered = check_op(_model(nodes, {"x": [1, 2, 3, 3]}, ["y"], inits, 17), {"x": [1, 2, 3, 3]}, max_lsb=1)
    assert "TRANSPOSE" not in ops_of(lowered)


def test_flatten_read_by_more_than_a_fully_connected_layer_transposes():
    """If the flattened tensor is also a graph output, its element order must be ONNX's: one TRANSPOSE."""
    rng = np.random.default_rng(6)
    inits: dict = {"fc": rng.normal(0, 0.2, (36, 5)).astype(np.float32)}
    nodes = [_conv("w1", "x", "a", 2, 4, 1, inits), helper.make_node("Flatten", ["a"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    lowered = check_op(_model(nodes, {"x": [1, 2, 3, 3]}, ["y", "f"], inits, 17), {"x": [1, 2, 3, 3]}, max_lsb=1)
    assert ops_of(lowered).count("TRANSPOSE") == 1
