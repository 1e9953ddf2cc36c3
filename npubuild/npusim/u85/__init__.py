"""npu-sim for the Ethos-U85 command stream: Vela's regor back end, a different register map from U55/U65.

What changes from U55/U65, and where it is modelled:
- registers (the register map, field layouts and enum names; decoding and a disassembler that
  reproduces `vela --verbose-register-command-stream` field by field),
- weights (the standard and the fast weight stream formats, the U85 weight traversal per core,
  10-byte scale entries for 32- and 48-bit accumulators),
- operands (IFM/IFM2/OFM from the registers: TILE2X2 tiles, CHAINED operands that stay in a chaining
  buffer, NONE for scalars and disabled outputs; the OFM's transpose and reverse on write),
- scaling (the six OFM rounding modes and the double-round position), activation (clip, LUTs),
- conv (CONV, DEPTHWISE, matmul with IFM2 as weights, accumulator keep/IFM2 source),
  pool (MAX, MIN, AVERAGE, SUM, REDUCE_SUM, NONE, ARGMAX_X/Y), elementwise (arithmetic, shifts,
  comparisons, logic, DIV), resize (BILINEAR, NEAREST, REPLICATE), dma (1D/2D/3D strides, gather and
  scatter through an index list),
- machine (memory, chaining buffers, the LUT RAM, the accumulator, one op at a time).
"""
