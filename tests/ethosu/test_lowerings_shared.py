"""The lower stage's Lowerings shares a lowering between options that agree on every option field it read:
the shared graph is the one lowering with the other options makes, and options differing in a field read are
lowered anew."""

from __future__ import annotations

from dataclasses import replace

from npbtest.lowering import downsampling_block, se_pool_model
from npbtest.ops import calib, quantize_model

from npubuild.ethosu.families import Lowerings
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, FIELDS, PORTABLE, recorded


def test_reads_are_recorded_through_predicates_and_copies() -> None:
    watched, reads = recorded(FAMILY_OPTIONS["u65"])
    assert not reads
    watched.planar_input(3)  # a predicate reads its threshold field
    assert reads == {"planar_input_channels"}
    replace(watched, softmax_wide=True)  # a copy reads every field it keeps
    assert reads == set(FIELDS) - {"softmax_wide"}
    assert all(getattr(watched, name) == getattr(FAMILY_OPTIONS["u65"], name) for name in FIELDS)


def test_options_agreeing_on_what_was_read_share_the_graph() -> None:
    model = quantize_model(downsampling_block(8, 16, 8), calib("x", [1, 8, 8, 8], n=8))
    lowerings = Lowerings(model, "int", {})
    first = lowerings(PORTABLE)
    (read, _, _), = lowerings.reads
    assert "concat_order" in read and "softmax_wide" not in read  # no softmax in this model
    softmax = replace(PORTABLE, softmax_wide=True)
    assert lowerings(softmax) is first and len(lowerings.reads) == 1
    assert first.lowered is not None
    assert first.lowered.tosa == lower_model(model, "int", options=softmax).tosa
    u55 = FAMILY_OPTIONS["u55"]  # differs on fields every lowering reads (concat_order): lowered again
    own = lowerings(u55)
    assert own is not first and len(lowerings.reads) == 2
    assert own.lowered is not None and own.lowered.tosa == lower_model(model, "int", family="u55").tosa


def test_the_portable_lowering_is_shared_too() -> None:
    """The stage's first lowering (model.tosa's, finding the host nodes) is kept with what it read: a measured
    variant that agrees with the portable options there is that graph, not lowered again."""
    model = quantize_model(downsampling_block(8, 16, 8), calib("x", [1, 8, 8, 8], n=8))
    lowerings = Lowerings(model, "int", {})
    first = lowerings.portable()
    assert first.whole and lowerings.host == {} and len(lowerings.reads) == 1
    variant = replace(PORTABLE, softmax_wide=True, softmax_wide_row=8)  # fields this model never reads
    assert lowerings(variant) is first and len(lowerings.reads) == 1
    assert first.lowered is not None and first.lowered.tosa == lower_model(model, "int", options=variant).tosa
    assert lowerings.arrays is not None and lowerings.arrays.for_model(model) is not None


def test_an_observed_predicate_shares_by_its_answers() -> None:
    """plane_rows is read through plane_rows_fit, noted by its arguments and answer: row-sum limits that give
    the model's plane the same answer share the graph, limits that give another answer are lowered anew."""
    model = quantize_model(se_pool_model(32, 16, 16), calib("x", [1, 8, 16, 16], n=8))
    u55 = FAMILY_OPTIONS["u55"]
    assert u55.plane_rows is not None
    lowerings = Lowerings(model, "int", {})
    first = lowerings(u55)
    (values, read, _), = lowerings.reads
    assert "plane_rows" not in values and [name for name, _ in read.calls] == ["plane_rows_fit"]
    assert list(read.calls.values()) == [True]  # the 16x16x32 plane takes row sums on U55
    wider = replace(u55, plane_rows=replace(u55.plane_rows, min_side=5, min_plane=100))  # same answer here
    assert lowerings(wider) is first and len(lowerings.reads) == 1
    assert first.lowered is not None and first.lowered.tosa == lower_model(model, "int", options=wider).tosa
    never = replace(u55, plane_rows=replace(u55.plane_rows, min_elements=1 << 20))  # another answer
    own = lowerings(never)
    assert own is not first and len(lowerings.reads) == 2
    assert own.lowered is not None and own.lowered.tosa == lower_model(model, "int", options=never).tosa
    assert own.lowered.tosa != first.lowered.tosa


def test_an_option_read_only_where_it_could_apply() -> None:
    """U65 reads a 3-channel image input planar, which no input staging takes: staged_input_min_row is not read
    there (nor dilation_phase_min, by a 2-D conv), so U65's staged-input variant is U65's own graph."""
    model = quantize_model(downsampling_block(3, 16, 16), calib("x", [1, 3, 16, 16], n=8))
    u65 = FAMILY_OPTIONS["u65"]
    lowerings = Lowerings(model, "int", {})
    first = lowerings(u65)
    (values, _, _), = lowerings.reads
    assert "planar_input_channels" in values
    assert "staged_input_min_row" not in values and "dilation_phase_min" not in values
    staged = replace(u65, staged_input_min_row=128)
    assert lowerings(staged) is first
    assert first.lowered is not None and first.lowered.tosa == lower_model(model, "int", options=staged).tosa
    nhwc = replace(u65, planar_input_channels=None, staged_input_min_row=128)  # NHWC: staging reads its row
    lowerings(nhwc)
    assert "staged_input_min_row" in lowerings.reads[-1][0]


def test_a_whole_lowering_is_shared_by_options_agreeing_on_what_was_read() -> None:
    """`whole` (a family's exact-only forms, exact_forms_only) takes a lowering made with options that agree on
    every field it read: that very graph, lower_model's for these options; options differing in a field read
    are lowered anew, and that lowering serves later options in turn."""
    model = quantize_model(downsampling_block(8, 16, 8), calib("x", [1, 8, 8, 8], n=8))
    lowerings = Lowerings(model, "int", {})
    first = lowerings.portable()
    assert first.whole and first.lowered is not None
    variant = replace(PORTABLE, softmax_wide=True, softmax_wide_row=8)  # fields this model never reads
    assert variant not in lowerings.done
    assert lowerings.whole(variant) is first.lowered
    assert first.lowered.tosa == lower_model(model, "int", options=variant).tosa
    u55 = FAMILY_OPTIONS["u55"]  # differs on concat_order, which every lowering reads
    own = lowerings.whole(u55)
    assert own is not first.lowered and own.tosa == lower_model(model, "int", family="u55").tosa
    # kept with what it read: later options agreeing with u55 there (a measured variant) are that graph too
    later = lowerings(replace(u55, softmax_wide=not u55.softmax_wide))
    assert later.lowered is own and len(lowerings.reads) == 2
