"""A small CNN trained on scikit-learn's 8x8 digits, in numpy, deterministically and in seconds.

The data ships with scikit-learn, so the example needs no download: a real
classifier with a real held-out split, to show float vs int8 top-1 accuracy.
`python -m npubuild.models.digits OUT_DIR` writes OUT_DIR/models/digits_cnn.onnx
and OUT_DIR/data/digits_{calib,eval_inputs,eval_labels}.npy.

Network: Conv 3x3 (8) + ReLU, MaxPool 2, Conv 3x3 (16) + ReLU, MaxPool 2,
Flatten, Gemm (64 -> 10). Trained with Adam on mini-batches, seed fixed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 0
EVAL_FRACTION = 0.2
CALIB_SAMPLES = 64


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, eval_x, eval_y): inputs (N, 1, 8, 8) float32 in [0, 1], labels int64."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(y))
    n_eval = int(round(len(y) * EVAL_FRACTION))
    ev, tr = order[:n_eval], order[n_eval:]
    return x[tr], y[tr], x[ev], y[ev]


# ----------------------------------------------------------------------------- numpy layers (NCHW)


def _im2col(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, H, W, C*9) patches of a 3x3 'same' convolution."""
    n, c, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=-1)  # N C H W 9
    return cols.transpose(0, 2, 3, 1, 4).reshape(n, h, w, c * 9)


def _col2im(dcols: np.ndarray, c: int) -> np.ndarray:
    n, h, w, _ = dcols.shape
    d = dcols.reshape(n, h, w, c, 9).transpose(0, 3, 1, 2, 4)
    dp = np.zeros((n, c, h + 2, w + 2), dcols.dtype)
    k = 0
    for i in range(3):
        for j in range(3):
            dp[:, :, i:i + h, j:j + w] += d[..., k]
            k += 1
    return dp[:, :, 1:-1, 1:-1]


def _pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = blocks.max(axis=(3, 5))
    mask = blocks == out[:, :, :, None, :, None]
    return out, mask


def _unpool(d: np.ndarray, mask: np.ndarray) -> np.ndarray:
    n, c, h, w = d.shape
    # ties share the gradient (they are rare with float inputs and harmless)
    return (mask * d[:, :, :, None, :, None]).reshape(n, c, h * 2, w * 2)


@dataclass
class Params:
    w1: np.ndarray  # (8, 1, 3, 3)
    b1: np.ndarray
    w2: np.ndarray  # (16, 8, 3, 3)
    b2: np.ndarray
    w3: np.ndarray  # (10, 64)
    b3: np.ndarray

    def items(self) -> list[tuple[str, np.ndarray]]:
        return list(vars(self).items())


def init_params(rng: np.random.Generator) -> Params:
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return Params(he((8, 1, 3, 3), 9), np.zeros(8, np.float32), he((16, 8, 3, 3), 72), np.zeros(16, np.float32),
                  he((10, 64), 64) * np.float32(0.5), np.zeros(10, np.float32))


def forward(p: Params, x: np.ndarray, keep: bool = False):
    n = x.shape[0]
    c1 = _im2col(x)
    z1 = c1 @ p.w1.reshape(8, -1).T + p.b1  # N H W 8
    a1 = np.maximum(z1, 0).transpose(0, 3, 1, 2)
    m1, k1 = _pool(a1)  # N 8 4 4
    c2 = _im2col(m1)
    z2 = c2 @ p.w2.reshape(16, -1).T + p.b2
    a2 = np.maximum(z2, 0).transpose(0, 3, 1, 2)
    m2, k2 = _pool(a2)  # N 16 2 2
    f = m2.reshape(n, -1)
    logits = f @ p.w3.T + p.b3
    if not keep:
        return logits
    return logits, (c1, z1, k1, c2, z2, k2, f)


def gradients(p: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
    n = x.shape[0]
    logits, (c1, z1, k1, c2, z2, k2, f) = forward(p, x, keep=True)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    loss = float(-np.mean(np.log(prob[np.arange(n), y] + 1e-12)))
    dl = prob
    dl[np.arange(n), y] -= 1
    dl /= n
    gw3, gb3 = dl.T @ f, dl.sum(0)
    dm2 = (dl @ p.w3).reshape(n, 16, 2, 2)
    dz2 = _unpool(dm2, k2).transpose(0, 2, 3, 1) * (z2 > 0)
    gw2 = (dz2.reshape(-1, 16).T @ c2.reshape(-1, c2.shape[-1])).reshape(p.w2.shape)
    gb2 = dz2.sum((0, 1, 2))
    dm1 = _col2im(dz2 @ p.w2.reshape(16, -1), 8)
    dz1 = _unpool(dm1, k1).transpose(0, 2, 3, 1) * (z1 > 0)
    gw1 = (dz1.reshape(-1, 8).T @ c1.reshape(-1, c1.shape[-1])).reshape(p.w1.shape)
    gb1 = dz1.sum((0, 1, 2))
    return loss, Params(gw1, gb1, gw2, gb2, gw3, gb3)


def train(x: np.ndarray, y: np.ndarray, epochs: int = 15, batch: int = 32, lr: float = 0.01) -> Params:
    """Adam on shuffled mini-batches; every random choice comes from one seeded generator."""
    rng = np.random.default_rng(SEED)
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    t = 0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for s in range(0, len(y), batch):
            idx = order[s:s + batch]
            _, g = gradients(p, x[idx], y[idx])
            t += 1
            for k, grad in g.items():
                m[k] = 0.9 * m[k] + 0.1 * grad
                v[k] = 0.999 * v[k] + 0.001 * grad * grad
                step = lr * (m[k] / (1 - 0.9**t)) / (np.sqrt(v[k] / (1 - 0.999**t)) + 1e-8)
                setattr(p, k, (getattr(p, k) - step).astype(np.float32))
    return p


def to_onnx(p: Params) -> onnx.ModelProto:
    """The trained network as an ONNX graph (opset 17), the same maths as `forward`."""
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), k) for k, a in p.items()]
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["conv1"], name="conv1", **conv),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", **pool),
        helper.make_node("Conv", ["pool1", "w2", "b2"], ["conv2"], name="conv2", **conv),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool2"], name="pool2", **pool),
        helper.make_node("Flatten", ["pool2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="npubuild.models")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def generate() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The trained model and the arrays the example spec uses."""
    tx, ty, ex, ey = load_split()
    p = train(tx, ty)
    arrays = {"digits_calib": tx[:CALIB_SAMPLES], "digits_eval_inputs": ex, "digits_eval_labels": ey}
    return to_onnx(p), arrays


def main(argv: list[str]) -> int:
    from npubuild.fileio import write_bytes

    if len(argv) != 1:
        print("usage: python -m npubuild.models.digits OUT_DIR  (e.g. configs)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    model, arrays = generate()
    write_bytes(out / "models" / "digits_cnn.onnx", model.SerializeToString())
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(out / "data" / f"{name}.npy", a, allow_pickle=False)
    print(out / "models" / "digits_cnn.onnx")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
