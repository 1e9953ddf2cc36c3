"""The example networks (MLPerf-Tiny style), each a function returning an ONNX model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from npubuild.models.builder import GraphBuilder


def ds_cnn(seed: int = 0) -> onnx.ModelProto:
    """Keyword spotting DS-CNN (MLPerf Tiny KWS): 49x10 MFCC in, 12 classes out.

    Conv 10x4/2 + BN + ReLU, four depthwise-separable blocks (3x3 depthwise +
    1x1 pointwise, each with BN + ReLU), global average pool, fully connected.
    """
    g = GraphBuilder("ds_cnn_kws", seed)
    x = g.input("input", ["N", 1, 49, 10])
    c = 64
    x = g.relu(g.batchnorm(g.conv(x, 1, c, (10, 4), stride=(2, 2), pads=[4, 1, 5, 2]), c))
    for _ in range(4):
        x = g.relu(g.batchnorm(g.conv(x, c, c, (3, 3), group=c), c))
        x = g.relu(g.batchnorm(g.conv(x, c, c, (1, 1)), c))
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, c, 12)
    g.output(x, ["N", 12])
    return g.model()


def mobilenet_v1(seed: int = 0, alpha: float = 0.25, size: int = 96, classes: int = 2) -> onnx.ModelProto:
    """Visual wake words MobileNetV1 (MLPerf Tiny VWW): alpha 0.25, 96x96 RGB in, 2 classes.

    Conv 3x3/2 then 13 depthwise-separable blocks, each conv followed by
    BatchNorm and ReLU6 (Clip 0..6), stride-2 convs padded like Keras 'same'
    (bottom/right only), global average pool, fully connected, softmax.
    """
    g = GraphBuilder("mobilenet_v1_vww", seed)
    x = g.input("input", ["N", 3, size, size])

    def ch(c: int) -> int:
        return max(8, int(c * alpha))

    same2 = [0, 0, 1, 1]
    c = ch(32)
    x = g.conv_bn(x, 3, c, (3, 3), act="Relu6", stride=(2, 2), pads=same2)
    blocks = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for cout, s in blocks:
        x = g.conv_bn(x, c, c, (3, 3), act="Relu6", stride=(s, s), group=c, pads=same2 if s == 2 else None)
        x = g.conv_bn(x, c, ch(cout), (1, 1), act="Relu6")
        c = ch(cout)
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.node("Softmax", [g.gemm(x, c, classes)], axis=-1)
    g.output(x, ["N", classes])
    return g.model()


def resnet8(seed: int = 0) -> onnx.ModelProto:
    """Image classification ResNet-8 (MLPerf Tiny IC): 32x32 RGB in, 10 classes.

    Conv 3x3 16, three residual stacks (16, 32, 64 filters; the last two
    stride 2 with a 1x1 strided projection shortcut), average pool 8x8, fully
    connected, softmax.
    """
    g = GraphBuilder("resnet8_ic", seed)
    x = g.input("input", ["N", 3, 32, 32])
    x = g.conv_bn(x, 3, 16, (3, 3))
    c = 16
    for cout, s in ((16, 1), (32, 2), (64, 2)):
        pads = [0, 0, 1, 1] if s == 2 else None
        y = g.conv_bn(x, c, cout, (3, 3), stride=(s, s), pads=pads)
        y = g.conv_bn(y, cout, cout, (3, 3), act=None)
        short = x if s == 1 and c == cout else g.conv(x, c, cout, (1, 1), stride=(s, s), pads=[0, 0, 0, 0])
        x = g.relu(g.node("Add", [y, short]))
        c = cout
    x = g.node("AveragePool", [x], kernel_shape=[8, 8], strides=[8, 8])
    x = g.node("Flatten", [x], axis=1)
    x = g.node("Softmax", [g.gemm(x, c, 10)], axis=-1)
    g.output(x, ["N", 10])
    return g.model()


def autoencoder(seed: int = 0) -> onnx.ModelProto:
    """Anomaly detection fully connected autoencoder (MLPerf Tiny AD): 640 in, 640 out.

    Dense layers 128-128-128-128-8-128-128-128-128, each Gemm + BatchNorm +
    ReLU, then a plain Gemm back to 640.
    """
    g = GraphBuilder("autoencoder_ad", seed)
    x = g.input("input", ["N", 640])
    c = 640
    for cout in (128, 128, 128, 128, 8, 128, 128, 128, 128):
        x = g.relu(g.batchnorm(g.gemm(x, c, cout), cout))
        c = cout
    x = g.gemm(x, c, 640)
    g.output(x, ["N", 640])
    return g.model()


def mobilenet_v3_block(seed: int = 0) -> onnx.ModelProto:
    """A MobileNetV3-style network: hard-swish stem, one inverted residual block, classifier.

    Block: 1x1 expand + BN + HardSwish, 3x3 depthwise + BN + HardSwish,
    squeeze-excite (GlobalAveragePool, 1x1 Conv, ReLU, 1x1 Conv, HardSigmoid
    with torch's alpha 1/6, Mul), 1x1 project + BN, residual Add.
    """
    g = GraphBuilder("mobilenet_v3_block", seed)
    x = g.input("input", ["N", 3, 64, 64])
    c, e, r = 16, 64, 16
    x = g.conv_bn(x, 3, c, (3, 3), act="HardSwish", stride=(2, 2), pads=[1, 1, 1, 1])
    y = g.conv_bn(x, c, e, (1, 1), act="HardSwish")
    y = g.conv_bn(y, e, e, (3, 3), act="HardSwish", group=e)
    s = g.node("GlobalAveragePool", [y])
    s = g.relu(g.conv(s, e, r, (1, 1)))
    s = g.node("HardSigmoid", [g.conv(s, r, e, (1, 1))], alpha=1.0 / 6.0, beta=0.5)
    y = g.node("Mul", [y, s])
    y = g.conv_bn(y, e, c, (1, 1), act=None)
    x = g.node("Add", [x, y])
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, c, 10)
    g.output(x, ["N", 10])
    return g.model()


def unet(seed: int = 0) -> onnx.ModelProto:
    """A small U-Net for segmentation: 64x64 grey in, a 64x64 mask of logits out.

    Two encoder levels (two Conv+BN+ReLU, MaxPool 2x2), a bottleneck, two
    decoder levels (Resize x2 upsampling, nearest then bilinear half-pixel,
    Concat with the encoder's skip tensor, two Conv+BN+ReLU), 1x1 Conv head.
    """
    g = GraphBuilder("unet_small", seed)
    x = g.input("input", ["N", 1, 64, 64])

    def double(x: str, cin: int, cout: int) -> str:
        return g.conv_bn(g.conv_bn(x, cin, cout, (3, 3)), cout, cout, (3, 3))

    e1 = double(x, 1, 8)
    e2 = double(g.node("MaxPool", [e1], kernel_shape=[2, 2], strides=[2, 2]), 8, 16)
    b = double(g.node("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2]), 16, 32)
    scales = g.const(np.asarray([1, 1, 2, 2], np.float32), "scales")
    u2 = g.node("Resize", [b, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")
    d2 = double(g.node("Concat", [u2, e2], axis=1), 48, 16)
    u1 = g.node("Resize", [d2, "", scales], mode="linear", coordinate_transformation_mode="half_pixel")
    d1 = double(g.node("Concat", [u1, e1], axis=1), 24, 8)
    y = g.conv(d1, 8, 1, (1, 1), pads=[0, 0, 0, 0])
    g.output(y, ["N", 1, 64, 64])
    return g.model()


def transformer(seed: int = 0, seq: int = 16, d: int = 64, heads: int = 4, ffn: int = 128,
                layers: int = 2) -> onnx.ModelProto:
    """A 2-layer transformer encoder (post-norm, like torch's nn.TransformerEncoderLayer).

    Self-attention with heads split by Reshape/Transpose, scaled MatMul,
    Softmax; residual Add + LayerNormalization; a GELU feed-forward (ONNX
    Gelu, opset 20); LayerNormalization again.
    """
    g = GraphBuilder("transformer_encoder", seed, opset=20)
    x = g.input("input", ["N", seq, d])
    hd = d // heads
    split = g.shape([-1, seq, heads, hd])
    merge = g.shape([-1, seq, d])
    scale = g.const(np.float32(1.0 / np.sqrt(hd)), "scale")
    for _ in range(layers):
        q = g.node("Transpose", [g.node("Reshape", [g.linear(x, d, d), split])], perm=[0, 2, 1, 3])
        k = g.node("Transpose", [g.node("Reshape", [g.linear(x, d, d), split])], perm=[0, 2, 3, 1])
        v = g.node("Transpose", [g.node("Reshape", [g.linear(x, d, d), split])], perm=[0, 2, 1, 3])
        att = g.node("Softmax", [g.node("Mul", [g.node("MatMul", [q, k]), scale])], axis=-1)
        o = g.node("Transpose", [g.node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        o = g.linear(g.node("Reshape", [o, merge]), d, d)
        x = g.layernorm(g.node("Add", [x, o]), d)
        f = g.linear(g.node("Gelu", [g.linear(x, d, ffn)]), ffn, d)
        x = g.layernorm(g.node("Add", [x, f]), d)
    g.output(x, ["N", seq, d])
    return g.model()


def kws_fused_gelu(seed: int = 0, classes: int = 12) -> onnx.ModelProto:
    """A keyword spotter as onnxruntime's transformer optimiser leaves it: a contrib op in the middle.

    49x10 MFCC in; Conv 10x4/2 + BN, the fused `com.microsoft:Gelu` (onnxruntime's contrib op, lowered by
    lowering/ops/contrib_gelu.py as one TABLE), two depthwise-separable blocks with ReLU, global average
    pool, fully connected.
    """
    g = GraphBuilder("kws_fused_gelu", seed)
    x = g.input("input", ["N", 1, 49, 10])
    c = 32
    x = g.batchnorm(g.conv(x, 1, c, (10, 4), stride=(2, 2), pads=[4, 1, 5, 2]), c)
    x = g.node("Gelu", [x], domain="com.microsoft")
    for _ in range(2):
        x = g.relu(g.batchnorm(g.conv(x, c, c, (3, 3), group=c), c))
        x = g.relu(g.batchnorm(g.conv(x, c, c, (1, 1)), c))
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    g.output(g.gemm(x, c, classes), ["N", classes])
    return g.model(extra_opsets={"com.microsoft": 1})


def alexnet_lrn(seed: int = 0, size: int = 32, classes: int = 10) -> onnx.ModelProto:
    """An AlexNet-style classifier with its LocalResponseNormalization: the host-fallback example.

    32x32 RGB in; Conv 5x5 32 + ReLU, LRN (AlexNet's size 5, alpha 1e-4, beta 0.75, bias 2), MaxPool 3x3/2,
    Conv 3x3 64 + ReLU, MaxPool 3x3/2, global average pool, fully connected. npubuild lowers LRN in the
    FP profile only, so in int8 it runs on the host (onnxruntime) between two NPU partitions.
    """
    g = GraphBuilder("alexnet_lrn", seed)
    x = g.input("input", ["N", 3, size, size])
    x = g.relu(g.conv(x, 3, 32, (5, 5), pads=[2, 2, 2, 2]))
    x = g.node("LRN", [x], size=5, alpha=1e-4, beta=0.75, bias=2.0)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = g.relu(g.conv(x, 32, 64, (3, 3), pads=[1, 1, 1, 1]))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    g.output(g.gemm(x, 64, classes), ["N", classes])
    return g.model()


def tcn_imu(seed: int = 0, channels: int = 6, length: int = 128, width: int = 16, classes: int = 6) -> onnx.ModelProto:
    """A temporal convolutional network for IMU activity recognition: 6-axis samples in, 6 classes out.

    A Conv1d stem, four residual blocks of two causal dilated Conv1d (kernel 3, dilations 1, 2, 4, 8;
    each padded on the left by an explicit Pad, as torch writes a causal layer) with ReLU, global average
    pool over time, fully connected.
    """
    g = GraphBuilder("tcn_imu", seed)
    x = g.input("input", ["N", channels, length])
    x = g.relu(g.conv1d(x, channels, width, 3, causal=True))
    for d in (1, 2, 4, 8):
        y = g.relu(g.conv1d(x, width, width, 3, dilation=d, causal=True))
        y = g.conv1d(y, width, width, 3, dilation=d, causal=True)
        x = g.relu(g.node("Add", [x, y]))
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, width, classes)
    g.output(x, ["N", classes])
    return g.model()


def _recurrent_kws(op: str, seed: int, hidden: int = 48, frames: int = 49, mfcc: int = 10, width: int = 32,
                   classes: int = 12) -> onnx.ModelProto:
    """Keyword spotting with a recurrent layer: 49x10 MFCC frames in, 12 classes out.

    A Conv1d over time (stride 2: 25 steps) + ReLU, the GRU or LSTM over the steps, its last hidden
    state through a fully connected layer.
    """
    g = GraphBuilder(f"{op.lower()}_kws", seed)
    x = g.input("input", ["N", frames, mfcc])
    x = g.node("Transpose", [x], perm=[0, 2, 1])  # [N, MFCC, T]: the features are the conv's channels
    x = g.relu(g.conv1d(x, mfcc, width, 3, stride=2))
    x = g.node("Transpose", [x], perm=[2, 0, 1])  # [T, N, C], ONNX's sequence-first layout
    _, h = g.recurrent(op, x, width, hidden)
    x = g.node("Reshape", [h, g.shape([-1, hidden])])
    x = g.gemm(x, hidden, classes)
    g.output(x, ["N", classes])
    return g.model()


def gru_kws(seed: int = 0) -> onnx.ModelProto:
    """Keyword spotting, Conv1d + GRU (48 units) over 25 steps (see _recurrent_kws)."""
    return _recurrent_kws("GRU", seed)


def lstm_kws(seed: int = 0) -> onnx.ModelProto:
    """Keyword spotting, Conv1d + LSTM (48 units) over 25 steps (see _recurrent_kws)."""
    return _recurrent_kws("LSTM", seed)


def mobilevit_block(seed: int = 0, size: int = 32, d: int = 32, heads: int = 2, classes: int = 10) -> onnx.ModelProto:
    """A MobileViT-style network: a SiLU conv stem, one MobileViT block, classifier.

    Block (Mehta & Rastegari, 2022): a 3x3 conv + SiLU and a 1x1 conv to d channels (local
    representation); unfold into 2x2 patches ([N, 4, P, d]: the pixels at one offset of every patch are a
    sequence); one pre-norm transformer layer (LayerNormalization, 2-head attention with a scaled MatMul
    and Softmax, residual; LayerNormalization, SiLU feed-forward, residual); fold back; a 1x1 conv to the
    block's width, Concat with the block input, a 3x3 conv + SiLU. SiLU is x * Sigmoid(x) as torch writes it.
    """
    g = GraphBuilder("mobilevit_block", seed)
    x = g.input("input", ["N", 3, size, size])

    def silu(t: str) -> str:
        return g.node("Mul", [t, g.node("Sigmoid", [t])])

    c = 16
    x = silu(g.conv_bn(x, 3, c, (3, 3), act=None, stride=(2, 2), pads=[1, 1, 1, 1]))
    h = size // 2
    y = silu(g.conv_bn(x, c, c, (3, 3), act=None))
    y = g.conv(y, c, d, (1, 1), bias=False)
    p = h // 2  # patches per side
    y = g.node("Reshape", [y, g.shape([-1, d, p, 2, p, 2])])
    y = g.node("Transpose", [y], perm=[0, 3, 5, 2, 4, 1])  # [N, 2, 2, p, p, d]
    seq = g.node("Reshape", [y, g.shape([-1, 4, p * p, d])])  # [N, 4 offsets, P patches, d]
    hd = d // heads
    split = g.shape([-1, 4, p * p, heads, hd])
    scale = g.const(np.float32(1.0 / np.sqrt(hd)), "scale")
    t = g.layernorm(seq, d)
    q = g.node("Transpose", [g.node("Reshape", [g.linear(t, d, d), split])], perm=[0, 1, 3, 2, 4])
    k = g.node("Transpose", [g.node("Reshape", [g.linear(t, d, d), split])], perm=[0, 1, 3, 4, 2])
    v = g.node("Transpose", [g.node("Reshape", [g.linear(t, d, d), split])], perm=[0, 1, 3, 2, 4])
    att = g.node("Softmax", [g.node("Mul", [g.node("MatMul", [q, k]), scale])], axis=-1)
    o = g.node("Transpose", [g.node("MatMul", [att, v])], perm=[0, 1, 3, 2, 4])
    o = g.linear(g.node("Reshape", [o, g.shape([-1, 4, p * p, d])]), d, d)
    seq = g.node("Add", [seq, o])
    f = g.linear(silu(g.linear(g.layernorm(seq, d), d, 2 * d)), 2 * d, d)
    seq = g.node("Add", [seq, f])
    y = g.node("Reshape", [seq, g.shape([-1, 2, 2, p, p, d])])
    y = g.node("Transpose", [y], perm=[0, 5, 3, 1, 4, 2])  # [N, d, p, 2, p, 2]
    y = g.node("Reshape", [y, g.shape([-1, d, h, h])])
    y = g.conv_bn(y, d, c, (1, 1), act=None)
    x = silu(g.conv_bn(g.node("Concat", [x, y], axis=1), 2 * c, c, (3, 3), act=None))
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, c, classes)
    g.output(x, ["N", classes])
    return g.model()


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "ds_cnn": ds_cnn,
    "mobilenet_v1": mobilenet_v1,
    "resnet8": resnet8,
    "autoencoder": autoencoder,
    "mobilenet_v3_block": mobilenet_v3_block,
    "unet": unet,
    "transformer": transformer,
    "kws_fused_gelu": kws_fused_gelu,
    "alexnet_lrn": alexnet_lrn,
    "tcn_imu": tcn_imu,
    "gru_kws": gru_kws,
    "lstm_kws": lstm_kws,
    "mobilevit_block": mobilevit_block,
}
