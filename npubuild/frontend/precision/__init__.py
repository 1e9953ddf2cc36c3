"""Precision per layer: 16-bit activations (16x8) and 4-bit weights (8x4) on top of the int8 QDQ model.

The quantize stage's int8 QDQ model (its ranges, bias correction and equalisation chosen by measurement:
frontend/ptq) is the starting point; a precision plan says which activation groups are int16 and which layers'
weights are int4, and `rewrite.apply_plan` turns the int8 model into that mixed QDQ model, which stays the
reference the integer graph is checked against. The pieces:

- qdq.py: the int8 QDQ model as quantised activations (one Q and its DQs each), the groups that share one
  quantisation through data movement (promoted together) and the weighted layers.
- rules.py: which op reads and writes int16 on which NPU family (the lowering's int16 forms, Vela's
  constraints); a reader without an int16 form gets an int8 copy of its input (a convert), a producer
  without one keeps its group int8.
- rewrite.py: the plan applied: int16 scales from the calibration ranges, biases requantised, converts,
  int4 weights (per channel, symmetric, MSE-chosen scale).
- search.py: `precision: auto`, the fewest int16 groups and the most int4 layers within a budget, chosen
  by measurement against float and Vela's own cost estimate.

Why a rewrite and not onnxruntime's quantiser with per-tensor quant types (TensorQuantOverrides `quant_type`,
which it supports): the search measures one variant per layer, and onnxruntime re-runs its whole quantiser
for each (3-14 s per model on the real set; bench/precision_real.md), where the rewrite takes milliseconds
and keeps the int8 recipe (ranges, corrected biases) the quantize stage chose. onnxruntime's own QInt16
quantisation is the independent reference the rewrite and the int16 lowering forms are tested against.
"""
