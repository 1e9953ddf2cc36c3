"""One module per ONNX op family, each registering its lowerings with `@registry.lowers("OpType", ...)`.

Op modules import the shared building blocks of npubuild.lowering (emit, convolution, reduction, ...) and
the fused forms of npubuild.lowering.fusion, never each other.
"""
