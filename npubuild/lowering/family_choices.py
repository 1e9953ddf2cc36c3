"""Which NPU family takes which family-specific lowering form, in one table.

Each choice is a TOSA form that Vela 5.2 runs better on some Ethos-U families
than the portable form (the reason and the U55 numbers are at the lowering
that emits it). U65 has U55's support rules (same TOSA op set) but twice or
four times the MACs and a wider AXI, so a form that pays on U55 may lose on
U65; likewise U85-1024/2048 ("u85wide", U85's rules) against U85-128/256/512
("u85"): each entry lists the families it was measured to win on (U85 entries
on all five U85 sizes, the 13 example models; U55 entries on U55-32/64/128/256 by
bench/family_choices.py, decided by U55-128, the example target).
"""

from __future__ import annotations

CHOICES: dict[str, frozenset[str]] = {
    # Concat inputs copied in first (driver.copied_inputs_first): the SRAM peak of Vela's in-order copies
    # (unet U55-128 214.3 -> 177.5 KiB, same cycles; U85 only with concat_max_copy: the order alone costs
    # 0.1% in time there, with it the U-Nets gain 3% and SRAM 208 -> 177.6 KiB. The skip first puts the
    # upsample at channel 8, so Vela keeps the Concat NHWC, which its reader conv reads slower on the widest
    # U85s: unet U85-1024 99477 -> 101911 cycles, U85-2048 72073 -> 90680 (reader conv 13750 -> 28350),
    # against U85-128/256/512 -10.8/-10.4/-5.3%; so u85wide takes neither: the order alone is unet
    # U85-1024/2048 102191 / 88388 (SRAM 176 KiB), and on U85-128/512 531377 / 184545 against 531174 / 183922
    # portable)
    "concat_order": frozenset({"u55", "u65", "u85"}),
    # int8 requantize as a 1x1 depthwise conv instead of a RESCALE (emit.requantize_dw): U55-128 11-25% faster
    # on every shape, U65 only within emit.DW_MAX_CHANNELS / DW_MIN_PLANE (no example requantises int8 to int8)
    "dw_requantize": frozenset({"u55", "u65"}),
    # a Concat input that Vela copies anyway becomes a depthwise copy at the output's scale (ops_data): unet
    # U55-128 613785 -> 590969 cycles and, with concat_order, SRAM 214.3 -> 177.5 KiB (U55-32: +1830 cycles)
    "concat_dw_copy": frozenset({"u55", "u65"}),
    # ... or an elementwise MAXIMUM of the input with itself, no constant (concat_copy). Alone (portable order)
    # unet U85-1024 99477 -> 99146 cycles but U85-2048 72073 -> 74190: there Vela runs the 64x64x8 skip's
    # MAXIMUM in 6400 cycles against 4685 for its own MemoryCopy, and the reader conv 13750 -> 14618; SRAM stays
    # 208 KiB, so u85wide keeps Vela's copy (U85-128/512 with the order: 473658 / 174086, SRAM 177.6 KiB).
    # On U55 instead of the depthwise copy: unet U55-128 590969 -> 592889 cycles, U55-256 347990 -> 356614
    "concat_max_copy": frozenset({"u85"}),
    # half-pixel bilinear 2x as replication + depthwise blur: REQUIRED where RESIZE is nearest-only
    "bilinear_2x": frozenset({"u55", "u65"}),
    # that bilinear 2x in two channel halves, for the SRAM peak (channel_parts). U55 pays time for the SRAM
    # at every size: U55-128 unet 587183 -> 590969 cycles, 186.5 -> 177.5 KiB, unet_torch 637685 -> 644245,
    # 195.0 -> 178.5 KiB. On U65 the halves cost more time: unet / unet_torch 333340 -> 343846 / 363814 ->
    # 377785 cycles on U65-256, 231189 -> 239248 / 248166 -> 263010 on U65-512 (SRAM 186.5 / 195.0 -> 177.5
    # KiB). Most of it is Vela's estimate of the Concat's reader conv: its weight DMA is charged the cycles the
    # op before it cannot hide, and half a blur hides less (network_performance.cpp EstimateFullOpPerformance:
    # 51018 -> 58534 cycles), the rest the second replication/blur/pad pass (+3000)
    "bilinear_channel_split": frozenset({"u55"}),
    # a whole-plane mean at the same scale as REDUCE_SUM instead of AVG_POOL2D (ops_pool): resnet8 U55-128
    # 208718 -> 208228 cycles (U55-32 loses: 704930 -> 705476)
    "plane_sum": frozenset({"u55", "u65"}),
    # layer norm's seed widened by one ADD next to an int32 operand (norm_rows._w_for_product); this and the
    # next one each: transformer U55-128 230352 -> 229072 cycles (torch/dynamo 230768 -> 229488)
    "norm_widen_add": frozenset({"u55", "u65"}),
    # layer norm's table index round(m / 2^23) - 128 as one RESCALE (norm_rows.rsqrt_rows)
    "norm_index_rescale": frozenset({"u55", "u65"}),
    # a strided conv that never reaches the last input rows/cols gets zero kernel taps, not a SLICE (ops_conv);
    # on U65 the taps cost MACs: resnet8 U65-256 109039 -> 113824 cycles, off-chip +0.9 KiB; U55-128 saves 64
    # cycles for the same +0.9 KiB, U55-32/64/256 lose 1.5/0.5/0.3% (U55-32 SRAM 50.8 -> 68.1 KiB). Every U85
    # wins: resnet8 U85-128/512/1024/2048 166879 / 56268 / 37012 / 32770 -> 158906 / 55903 / 34948 / 30552
    # cycles (resnet8_torch alike)
    "conv_stride_taps": frozenset({"u85", "u85wide"}),
    # softmax's exp in int32 for small rows (softmax_int); U65 loses: resnet8 U65-256 109039 -> 109124 cycles,
    # mobilenet_v1 264315 -> 264521; U55 too: resnet8 U55-128 +281 cycles, mobilenet_v1 +535. Every U85 wins:
    # resnet8 U85-128/512/1024/2048 -65/-63/-103/-104 cycles, mobilenet_v1 -66/-64/-104/-105
    "softmax_wide": frozenset({"u85", "u85wide"}),
}


def takes(family: str | None, choice: str) -> bool:
    """Whether lowering for `family` (None: portable) uses the form `choice`."""
    return family is not None and family in CHOICES[choice]
