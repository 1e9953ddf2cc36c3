"""What a build deploys: one TFLite flatbuffer for TensorFlow Lite Micro, and the virtual device that runs it.

NPU partitions are Vela's `ethos-u` operators (its own bytes), host partitions the QDQ host ONNX translated to
TFLite builtin operators (host_ops.py); assemble.py puts them in one subgraph with an arena plan the command
streams agree with; virtual_device.py runs it (host operators in TFLite Micro's interpreter, ethos-u operators
in npu-sim), and manifest.py says what runs each partition and the arena it needs.
"""
