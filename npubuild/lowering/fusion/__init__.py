"""Forms spanning several ONNX nodes or TOSA ops: matched patterns (GELU, LayerNorm, ...), epilogues folded
into the op before them, and the integer forms of softmax and layer norm that Vela runs in few passes."""
