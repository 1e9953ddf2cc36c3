"""ethosu/measured: a family choice decided per model by Vela's own estimate (U65's planar form of a narrow NHWC
image input: it wins on some models and loses on others), the integers the same either way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO
from npbtest.ops import calib, quantize_model
from onnx import TensorProto, helper, numpy_helper

from npubuild.config.accelerator import FAMILIES
from npubuild.ethosu.families import lower_families
from npubuild.ethosu.measured import choose, narrow_nhwc_image, taken_of, vela_figures
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa


def nhwc_image_model(side: int):
    """An NHWC image input as tf2onnx exports one (Transpose to NCHW), then MediaPipe hand landmark's stem: a
    stride-2 3x3 'SAME' conv (padded at the end only, as TensorFlow pads), a 3x3 depthwise and a 1x1 conv."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
             for name, shape in (("w0", (24, 3, 3, 3)), ("w1", (24, 1, 3, 3)), ("w2", (16, 24, 1, 1)))]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="to_nchw"),
             helper.make_node("Conv", ["t", "w0"], ["c0"], strides=[2, 2], pads=[0, 0, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], group=24, pads=[1, 1, 1, 1], name="dw1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side, side, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, side // 2, side // 2])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return quantize_model(model, calib("x", [1, side, side, 3], n=4, low=0, high=1))


def transposes(tosa: bytes) -> int:
    return sum(op.op == "TRANSPOSE" for op in read_tosa(tosa).ops)


@pytest.mark.parametrize("side", [64, 224])
def test_u65_takes_the_form_vela_estimates_faster_for_this_model(side: int, tmp_path: Path):
    model = nhwc_image_model(side)
    assert narrow_nhwc_image(model)
    own = FAMILY_OPTIONS["u65"]
    forms = {opts: lower_model(model, "int", options=opts).tosa for opts in (own, replace(own, planar_input_channels=None))}
    planar, as_is = forms.values()
    assert transposes(planar) > transposes(as_is) == 0  # the planar form reads the image through a TRANSPOSE
    figures = [vela_figures(t, FAMILIES["u65"].measured_on) for t in forms.values()]
    ms = [f["ms"] for f in figures]
    options, record = choose(model, "u65", lambda o: lower_model(model, "int", options=o))
    assert record[0] == {"choice": "narrow image input planar", "target": "ethos-u65-256", "figures": figures,
                         "taken": int(ms[1] < ms[0])}
    assert (options.planar_input_channels is None) == (ms[1] < ms[0])
    io, _ = lower_families(model, "int", tmp_path, ["u65"])  # the lower stage writes the form taken
    (part,) = io.families["u65"].partitions
    assert (tmp_path / part.file).read_bytes() == lower_model(model, "int", options=options).tosa


def test_u85_stages_a_narrow_image_input_where_vela_estimates_it_faster(tmp_path: Path):
    model = nhwc_image_model(224)
    own = FAMILY_OPTIONS["u85"]
    forms = [lower_model(model, "int", options=o).tosa for o in (own, replace(own, staged_input_min_row=None))]
    assert forms[0] != forms[1]  # the staged form copies the input with a MAXIMUM first
    figures = [vela_figures(t, FAMILIES["u85"].measured_on) for t in forms]
    ms = [f["ms"] for f in figures]
    _, record = choose(model, "u85", lambda o: lower_model(model, "int", options=o))
    assert record[0] == {"choice": "narrow image input staged into SRAM", "target": "ethos-u85-256",
                         "figures": figures, "taken": int(ms[1] < ms[0])}


def test_size_mode_decides_by_memory(tmp_path: Path):
    """optimise: size measures the forms that trade memory for time too, and keeps a variant only where neither
    SRAM nor off-chip grows: U85's staged input copy (an SRAM buffer) is dropped for memory on this stem."""
    model = nhwc_image_model(224)
    options, record = choose(model, "u85", lambda o: lower_model(model, "int", options=o), optimise="size")
    staged = next(r for r in record if r["choice"] == "narrow image input staged into SRAM")
    own, off = staged["figures"]
    assert (staged["taken"] == 1) == (off["sram_kib"] <= own["sram_kib"] and off["offchip_kib"] <= own["offchip_kib"]
                                      and (off["sram_kib"], off["offchip_kib"]) != (own["sram_kib"], own["offchip_kib"])
                                      or (off["sram_kib"], off["offchip_kib"]) == (own["sram_kib"], own["offchip_kib"])
                                      and off["ms"] < own["ms"])


def two_prelus():
    """Palm detection's two kinds of PRelu: one on a 96x96x32 map (in DRAM on U85-256), one on 12x12x256."""
    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    def slope(name, c):  # slopes on both sides of 1: both kinds of channel
        return numpy_helper.from_array(rng.uniform(-1, 2, (c, 1, 1)).astype(np.float32), name)

    inits = [w("w0", (32, 8, 1, 1)), slope("s0", 32), w("w1", (256, 32, 1, 1)), slope("s1", 256),
             w("w2", (16, 256, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0"),
             helper.make_node("PRelu", ["c0", "s0"], ["p0"], name="prelu_big"),
             helper.make_node("MaxPool", ["p0"], ["m0"], kernel_shape=[8, 8], strides=[8, 8], name="pool"),
             helper.make_node("Conv", ["m0", "w1"], ["c1"], name="conv1"),
             helper.make_node("PRelu", ["c1", "s1"], ["p1"], name="prelu_small"),
             helper.make_node("Conv", ["p1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 96, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return quantize_model(model, calib("x", [1, 8, 96, 96], n=4))


def test_u85_decides_the_prelu_form_node_by_node(tmp_path: Path):
    """Each PRelu takes the form under which Vela's per-layer estimate charges it fewer cycles: the max / min
    form chained onto its depthwise on the big map, the branches on the small one (two depthwise convs reading
    256 per-channel scales each cost more than the branches' passes there); the mix beats both extremes."""
    model = two_prelus()
    options, record = choose(model, "u85", lambda o: lower_model(model, "int", options=o))
    prelu = record[0]
    assert prelu["choice"] == "PRelu as max / min of its pieces" and prelu["target"] == "ethos-u85-256"
    (branches_big, select_big), (branches_small, select_small) = prelu["nodes"]["prelu_big"], prelu["nodes"]["prelu_small"]
    assert select_big < branches_big and select_small > branches_small
    branches, select, mixed = (f["ms"] for f in prelu["figures"])
    assert prelu["taken"] == 2 and mixed < min(branches, select)
    assert options.prelu_select_nodes == {"prelu_big"} and not options.prelu_select
    io, _ = lower_families(model, "int", tmp_path, ["u85"])  # the lower stage writes the mix, checked bit for bit
    (part,) = io.families["u85"].partitions
    assert io.families["u85"].same_as_model_tosa
    assert (tmp_path / part.file).read_bytes() == lower_model(model, "int", options=options).tosa


def se_pool_model(h: int = 16, w: int = 16, c: int = 32):
    """Conv -> Relu -> GlobalAveragePool over an h x w x c map: a plane mean at a new scale."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("GlobalAveragePool", ["r0"], ["y"], name="mean")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 1, 1])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (c, 8, 1, 1)).astype(np.float32), "w0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return quantize_model(model, calib("x", [1, 8, h, w], n=4))


def layer_norm_model(beta: float = 0.0):
    """A [16, 64] layer norm with gamma around 1 and no beta, or a beta as trained transformers have (`beta` its
    largest magnitude). (torch's default affine, gamma 1 and beta 0, has no affine step: ops/norm._uniform_scale.)"""
    rng = np.random.default_rng(5)
    gamma = rng.uniform(0.8, 1.2, 64)
    inits = [numpy_helper.from_array(gamma.astype(np.float32), "g"),
             numpy_helper.from_array(rng.uniform(-beta, beta, 64).astype(np.float32), "b")]
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, name="ln")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return quantize_model(model, calib("x", [16, 64], n=4, low=-2, high=2))


def _pareto(own: dict, form: dict) -> bool:
    mem_own, mem_form = (own["sram_kib"], own["offchip_kib"]), (form["sram_kib"], form["offchip_kib"])
    return form["ms"] < own["ms"] if mem_form == mem_own else all(f <= o for f, o in zip(mem_form, mem_own, strict=True))


def layer_norm_beta_model():
    return layer_norm_model(beta=0.15)


@pytest.mark.parametrize("make,name", [(se_pool_model, "plane_pool_rows on (for memory)"),
                                       (layer_norm_model, "normalisation affine as a RESCALE"),
                                       (layer_norm_beta_model, "normalisation affine form per layer norm: every node")])
def test_size_mode_measures_the_forms_that_store_less(make, name):
    """The constant-free plane sum, the RESCALE affine and the affine as int16 vectors (or with an int32 beta)
    store less off-chip than the forms they replace on U55-128 (Vela's figures); size mode keeps each where
    neither SRAM nor off-chip grows (this SE pool's own 16 KiB of int16 bands raise its small SRAM peak: kept
    off; the layer norms': taken, the vectors where a layer norm has a beta)."""
    model = make()
    _, record = choose(model, "u55", lambda o: lower_model(model, "int", options=o), optimise="size")
    (choice,) = [r for r in record if r["choice"] == name]
    own, *forms = choice["figures"]
    assert all(form["offchip_kib"] < own["offchip_kib"] for form in forms)
    best = 0
    for i, form in enumerate(forms, 1):
        if _pareto(choice["figures"][best], form):
            best = i
    assert choice["taken"] == best
    assert choice["taken"] == (make is not se_pool_model)


def test_size_mode_decides_the_layer_norm_form_node_by_node():
    """The example transformer on U65-256: after a short elementwise pass (a layer norm's affine as int16 vectors)
    Vela buffers an FFN's first weights whole; with the FFN's first layers in two output halves it slices them as
    after the depthwise, so every layer norm takes the vectors at the depthwise's SRAM. The input is copied first
    (the residual Add read it from the DRAM arena). Each step keeps a whole graph no worse on either memory: the
    result beats the depthwise everywhere, and the last search's mix of depthwise and vectors without halves
    (12.50 / 80.66 KiB) on off-chip at the same SRAM."""
    from npubuild.ethosu.measured import fc_after_norm

    model = quantize_model(onnx.load(REPO / "configs" / "models" / "transformer.onnx"),
                           calib("input", [1, 16, 64], n=8, low=-1, high=1))
    lns = [n.name for n in model.graph.node if n.op_type == "LayerNormalization"]
    options, record = choose(model, "u65", lambda o: lower_model(model, "int", options=o), optimise="size")
    (copy,) = [r for r in record if r["choice"] == "input_copy on (for memory)"]
    assert copy["taken"] == 1 and options.input_copy
    assert copy["figures"][1]["offchip_kib"] < copy["figures"][0]["offchip_kib"]
    (halves,) = [r for r in record if r["choice"].startswith("fully connected layers after a layer norm")]
    own, vectors, *split = halves["figures"]
    assert vectors["sram_kib"] > own["sram_kib"]  # the vectors alone: the FFN weights buffered whole
    taken = halves["figures"][halves["taken"]]
    assert halves["taken"] >= 2 and taken["sram_kib"] <= own["sram_kib"] and taken["offchip_kib"] < own["offchip_kib"]
    widening, _ = fc_after_norm(model)
    assert options.fc_halves_nodes == frozenset(widening) and len(widening) == 2  # each FFN's first layer
    steps = [r for r in record if r["choice"].startswith("normalisation affine form per layer norm")]
    assert [r["choice"].split(": ")[1] for r in steps] == ["every node", *lns]
    assert options.norm_affine_vectors_nodes == frozenset(lns)
    (whole,) = [r for r in record if r["choice"] == "fully connected layers whole again (for memory)"]
    assert whole["taken"] == 0 and whole["figures"][1]["sram_kib"] > whole["figures"][0]["sram_kib"]
    final = whole["figures"][0]
    # the previous search's result: no halves, vectors on the two layer norms that do not feed an FFN
    feeds_ffn = {lns[0], lns[2]}  # post-LN: the first and third layer norms feed the FFNs
    before = replace(options, fc_halves_nodes=frozenset(), norm_affine_vectors_nodes=frozenset(lns) - feeds_ffn)
    was = vela_figures(lower_model(model, "int", options=before).tosa, "ethos-u65-256", "size")
    assert final["sram_kib"] <= was["sram_kib"] and final["offchip_kib"] < was["offchip_kib"]
    # the halves are exact: without the affine forms the integers are model.tosa's own
    exact = replace(options, norm_affine_vectors_nodes=frozenset(), norm_affine_wide_beta_nodes=frozenset())
    assert exact.same_integers and exact.fc_halves_nodes and "MAXIMUM" in {
        op.op for op in read_tosa(lower_model(model, "int", options=exact).tosa).ops}


def test_u55_measures_row_sums_on_a_narrow_plane():
    """DS-CNN's 25x5x64 head: U55's row-sum limits (8 rows and columns) leave it one REDUCE_SUM; the lower stage
    measures the rows there too and keeps whichever Vela estimates faster (the same integers either way)."""
    model = se_pool_model(25, 5, 64)
    options, record = choose(model, "u55", lambda o: lower_model(model, "int", options=o))
    (rows,) = [r for r in record if r["choice"] == "row sums for narrow plane means"]
    own, narrow = rows["figures"]
    assert rows["taken"] == int(narrow["ms"] < own["ms"])
    assert (options.plane_rows.min_side == 2) == bool(rows["taken"])


def test_size_mode_measures_copies_without_a_depthwise():
    """A U-Net step on U55-128 (upsample halves, Concat copies, requantisations as 1x1 depthwise convs): size mode
    measures the same copies with no depthwise (RESCALE, Vela's copy, the MAXIMUM copy), which store no
    per-channel constants, and keeps them only where neither SRAM nor off-chip grows."""
    from npbtest.lowering import qdq_unet_step

    model = qdq_unet_step(64, 8, 16)
    _, record = choose(model, "u55", lambda o: lower_model(model, "int", options=o), optimise="size")
    (copies,) = [r for r in record if r["choice"] == "copies without a depthwise (for memory)"]
    own, form = copies["figures"]
    assert form["offchip_kib"] < own["offchip_kib"]
    assert copies["taken"] == int(_pareto(own, form))


def test_each_graph_is_compiled_once_per_family():
    """U65 measures three choices on a narrow image (planar, staged, the stem's space-to-depth view): each one's
    first candidate is the form the one before took, which Vela is not asked to compile again
    (measured.Remembered); its figures are the ones that compile gave, and every graph compiled is a distinct
    one."""
    from npubuild.ethosu.measured import vela_figures_all

    model = nhwc_image_model(224)
    compiled: list[bytes] = []

    def counting(tosas: list[bytes], accelerator: str, optimise: str = "performance", layers: bool = False):
        compiled.extend(tosas)
        return vela_figures_all(tosas, accelerator, optimise, layers)

    _, record = choose(model, "u65", lambda o: lower_model(model, "int", options=o), measure=counting)
    assert [r["choice"] for r in record] == ["narrow image input planar", "narrow image input staged into SRAM",
                                             "2- or 3-channel stride-2 stem on its space-to-depth view"]
    assert record[1]["figures"][0] == record[0]["figures"][record[0]["taken"]]
    assert record[2]["figures"][0] == record[1]["figures"][record[1]["taken"]]
    assert len(compiled) == len(set(compiled)) == 4


def _figures(ms: float, sram: float, offchip: float) -> dict:
    return {"ms": ms, "sram_kib": sram, "offchip_kib": offchip}


def test_performance_mode_takes_the_smaller_form_only_at_the_same_time():
    """Time decides; at the same time a form whose SRAM and off-chip are no larger and one smaller is taken
    (PP-OCRv4 det's U55 Add order: 9.851 ms either way, 600.1 -> 487.6 KiB SRAM), a trade of one memory for
    the other is not, and an equal one keeps the family's own form (the first)."""
    own = _figures(9.851, 600.1, 1147.6)
    assert taken_of([own, _figures(9.851, 487.6, 1147.6)], "performance") == 1
    assert taken_of([own, _figures(9.851, 487.6, 1150.0)], "performance") == 0
    assert taken_of([own, dict(own)], "performance") == 0
    assert taken_of([own, _figures(9.9, 100.0, 100.0)], "performance") == 0
    assert taken_of([own, _figures(9.8, 900.0, 2000.0)], "performance") == 1


@pytest.mark.parametrize("side", [64, 224])
def test_u65_runs_a_3_channel_stem_on_its_space_to_depth_view_where_vela_estimates_it_faster(side: int):
    """The hand-landmark-like stem read as it is: on a 224x224 image the one-hot conv view (each pixel read once,
    the stem at stride 1 over 12 channels) is the faster on U65-256 (1.09 -> 0.95 ms), on a 64x64 one it is not;
    the integers are the same either way."""
    model = nhwc_image_model(side)
    options, record = choose(model, "u65", lambda o: lower_model(model, "int", options=o))
    (stem,) = [r for r in record if r["choice"] == "2- or 3-channel stride-2 stem on its space-to-depth view"]
    as_is, view = (f["ms"] for f in stem["figures"])
    assert stem["taken"] == int(view < as_is) == int(side == 224)
    assert (options.space_to_depth_channels == 3) == (side == 224)
    other = replace(options, space_to_depth_channels=1 if side == 224 else 3, space_to_depth_conv=True)
    a, b = (lower_model(model, "int", options=o) for o in (options, other))
    assert a.tosa != b.tosa
    feeds = {"x": np.random.default_rng(1).uniform(0, 1, (1, side, side, 3)).astype(np.float32)}
    ya, yb = run_tosa(a.tosa, a, feeds), run_tosa(b.tosa, b, feeds)
    assert all(np.array_equal(ya[k], yb[k]) for k in ya)
