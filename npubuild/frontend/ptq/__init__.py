"""Post-training quantisation on top of onnxruntime's quantiser: activation ranges chosen by error, bias
correction, cross-layer equalisation, and the per-model choice among them by measurement against float."""
