"""Example networks written in PyTorch and exported with torch.onnx, so graphs look like users' own.

torch is a test-only dependency: the exported .onnx files are committed in
configs/models/ and regenerated with `python -m npubuild.models --torch OUT_DIR`.
Weights are seeded; BatchNorm statistics are randomised so folding them matters.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import onnx

OPSET = 17


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - only without the test extra
        raise SystemExit("error: the torch-exported examples need torch (pip install -e '.[test]')") from None
    return torch


def _randomise_bn(model) -> None:
    torch = _torch()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d | torch.nn.BatchNorm1d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c) * 0.1)
            m.running_var.copy_(torch.rand(c) + 0.5)
            m.weight.data.copy_(torch.rand(c) * 0.6 + 0.7)
            m.bias.data.copy_(torch.randn(c) * 0.1)


def _export(model, example, dynamo: bool) -> onnx.ModelProto:
    """Export in eval mode with a dynamic batch dim, as users do; returns the ONNX model."""
    torch = _torch()
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch", min=1, max=64)
            prog = torch.onnx.export(model, (example,), dynamo=True, input_names=["input"], output_names=["output"],
                                     dynamic_shapes=({0: batch},), opset_version=18, verbose=False)
            prog.optimize()
            m = prog.model_proto
        else:
            buf = io.BytesIO()
            torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=OPSET, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
            m = onnx.load_from_string(buf.getvalue())
    m.producer_name = "npubuild.models.torch_zoo"
    m.producer_version = torch.__version__.split("+")[0]
    return m


def resnet8_torch() -> onnx.ModelProto:
    """ResNet-8 (MLPerf Tiny IC) in torch, TorchScript exporter: 32x32 RGB in, 10 logits out."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x):
            y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
            return torch.relu(y + self.short(x))

    class ResNet8(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
            self.pool = nn.AvgPool2d(8)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))

    model = ResNet8()
    _randomise_bn(model)
    return _export(model, torch.randn(1, 3, 32, 32), dynamo=False)


def mobilenet_v3_block_torch() -> onnx.ModelProto:
    """The MobileNetV3-style network in torch (Hardswish, SE with Hardsigmoid), dynamo exporter."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(1)

    def cbn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.Hardswish()) if act else nn.Sequential(*layers)

    class SE(nn.Module):
        def __init__(self, c: int, r: int):
            super().__init__()
            self.fc1 = nn.Conv2d(c, r, 1)
            self.fc2 = nn.Conv2d(r, c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = cbn(3, 16, 3, 2)
            self.block = nn.Sequential(cbn(16, 64, 1), cbn(64, 64, 3, groups=64), SE(64, 16), cbn(64, 16, 1, act=False))
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.block(x)
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    model = Net()
    _randomise_bn(model)
    return _export(model, torch.randn(1, 3, 64, 64), dynamo=True)


def transformer_torch() -> onnx.ModelProto:
    """The 2-layer transformer encoder in torch, TorchScript exporter (GELU becomes the Erf pattern)."""
    return _export(*_transformer_module(), dynamo=False)


def transformer_dynamo() -> onnx.ModelProto:
    """The same transformer encoder through the dynamo exporter (torch.onnx.export's default since 2.9)."""
    return _export(*_transformer_module(), dynamo=True)


def _transformer_module():
    """Seeded 2-layer post-norm encoder (sequence 16, width 64, 4 heads) and an example input."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(2)
    seq, d, heads, ffn = 16, 64, 4, 128

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

        def split(self, x):
            return x.reshape(-1, seq, heads, d // heads).transpose(1, 2)

        def forward(self, x):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            att = torch.softmax(q @ k.transpose(-2, -1) / (d // heads) ** 0.5, dim=-1)
            o = self.o((att @ v).transpose(1, 2).reshape(-1, seq, d))
            x = self.ln1(x + o)
            return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))

    model = nn.Sequential(Layer(), Layer())
    return model, torch.randn(1, seq, d)


def unet_torch() -> onnx.ModelProto:
    """The small U-Net in torch (MaxPool, bilinear Upsample, cat skips), dynamo exporter."""
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(3)

    def double(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2, self.b = double(1, 8), double(8, 16), double(16, 32)
            self.d2, self.d1 = double(48, 16), double(24, 8)
            self.head = nn.Conv2d(8, 1, 1)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)

        def forward(self, x):
            e1 = self.e1(x)
            e2 = self.e2(self.pool(e1))
            b = self.b(self.pool(e2))
            d2 = self.d2(torch.cat([self.up(b), e2], 1))
            return self.head(self.d1(torch.cat([self.up(d2), e1], 1)))

    model = UNet()
    _randomise_bn(model)
    return _export(model, torch.randn(1, 1, 64, 64), dynamo=True)


TORCH_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet8_torch": resnet8_torch,
    "mobilenet_v3_block_torch": mobilenet_v3_block_torch,
    "transformer_torch": transformer_torch,
    "transformer_dynamo": transformer_dynamo,
    "unet_torch": unet_torch,
}
