"""npu-sim for the Ethos-U85 command stream: Vela's regor back end, a different register map from U55/U65.

Modules, in the order an op meets them:
- registers: the register map (codes, field layouts, enum names); decoding into register snapshots and a
  disassembler that prints what `vela --verbose-register-command-stream` prints, field for field.
- machine: the run loop; machine_state: memory, chaining buffers, LUT RAM, the kept accumulator and the
  output stage every op ends with.
- operands: IFM/IFM2/OFM from the registers (TILE2X2 tiles, CHAINED operands in a chaining buffer, NONE for
  scalars and outputs left in the accumulator; the OFM's transpose and reverse on write); window: the
  padded, upscaled IFM tap by tap.
- weights: the standard (SWD) and fast (FWD) weight streams, the U85 traversal per weight decoder, the
  10-byte scale entries of 32- and 48-bit accumulators.
- conv (CONV, DEPTHWISE, matmul with IFM2 as weights), pool (MAX, MIN, AVERAGE, SUM, REDUCE_SUM, NONE,
  ARGMAX_X/Y), elementwise (arithmetic, shifts, comparisons, logic, DIV), resize (BILINEAR, NEAREST,
  REPLICATE), dma (1D/2D/3D strides, gather and scatter through an index list).
- scaling (the six OFM rounding modes and the double-round position), activation (clip, LUTs, wrap).
"""
