"""Torch models of the kinds embedded teams ship, exported both ways torch offers, through `npubuild compile`.

A benchmark script, not a test: it prints a Markdown table (bench/export_zoo.md keeps one). Each module below
is exported by the TorchScript exporter (opset 17) and by torch.export / dynamo (opset 18), then compiled for
ethos-u55-128 and ethos-u85-256 with default settings. Per build: status, NPU and host op counts and the host
op types, TOSA max error (LSB), the worst node's own error, quantisation SNR, Vela's inference time and the
transposes left. The first run of this (2026-12-01) found six defects, each now fixed and tested: int64 and
bool inputs (an internal error; token ids calibrated on row 0 only), torch.export's softplus threshold branch
(host GREATER/SELECT on U55), an NHWC image input (a real TRANSPOSE), no per-node check on a split model, a
float16 model (an unloadable host partition), a graph input passed through to an output (exit 2); and three
Vela performance traps, each now a lowering form (bench/perf_choices.md): a 2x2/2 ConvTranspose on U55/U65,
pixel_shuffle's DepthToSpace, a stride-4 patch-embedding conv (ConvNeXt U55-128 1.548 -> 0.373 ms).

    PYTHONPATH=. python bench/export_zoo.py [--only NAME ...] [--work DIR] [--out bench/export_zoo.md]

torch is a test dependency (pip install -e '.[test]'); 88 s on two cores (68 builds).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGETS = ("ethos-u55-128", "ethos-u85-256")


class ConvNeXt(nn.Module):
    """A ConvNeXt block: 7x7 depthwise, LayerNorm over channels (NHWC permute), 4x MLP with GELU, residual."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.stem, self.dw = nn.Conv2d(3, c, 4, 4), nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln, self.fc1, self.fc2, self.head = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c), nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.fc2(F.gelu(self.fc1(self.ln(self.dw(x).permute(0, 2, 3, 1))))).permute(0, 3, 1, 2)
        return self.head((x + y).mean((2, 3)))


class MBConv(nn.Module):
    """EfficientNet's MBConv: expand, 5x5 depthwise, squeeze-excite, SiLU, BatchNorm, residual."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.SiLU())
        self.exp = nn.Sequential(nn.Conv2d(c, 4 * c, 1), nn.BatchNorm2d(4 * c), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(4 * c, 4 * c, 5, 1, 2, groups=4 * c), nn.BatchNorm2d(4 * c), nn.SiLU())
        self.se1, self.se2 = nn.Conv2d(4 * c, 8, 1), nn.Conv2d(8, 4 * c, 1)
        self.proj, self.head = nn.Sequential(nn.Conv2d(4 * c, c, 1), nn.BatchNorm2d(c)), nn.Linear(c, 5)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(self.exp(x))
        g = torch.sigmoid(self.se2(F.silu(self.se1(y.mean((2, 3), keepdim=True)))))
        return self.head(F.adaptive_avg_pool2d(x + self.proj(y * g), 1).flatten(1))


class TwoInTwoOut(nn.Module):
    """An image and a feature vector in, logits and a sigmoid score out."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.o1, self.o2 = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(6, 8), nn.Linear(16, 3), nn.Linear(16, 2)

    def forward(self, img, vec):
        f = torch.cat([F.relu(self.a(img)).mean((2, 3)), torch.tanh(self.b(vec))], 1)
        return self.o1(f), torch.sigmoid(self.o2(f))


class Embedding(nn.Module):
    """Token ids (int64) into an embedding, a Conv1d, max over time: a text or command classifier."""

    def __init__(self):
        super().__init__()
        self.e, self.c, self.fc = nn.Embedding(50, 8), nn.Conv1d(8, 16, 3, padding=1), nn.Linear(16, 4)

    def forward(self, ids):
        return self.fc(torch.relu(self.c(self.e(ids).transpose(1, 2))).amax(2))


class Masked(nn.Module):
    """Features with a bool mask over the rows: masked mean, then a Linear."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 3)

    def forward(self, x, mask):
        return self.fc(x.masked_fill(~mask.unsqueeze(-1), 0.0).mean(1))


class FPN(nn.Module):
    """Two strided convs, nearest 2x upsampling plus a lateral 1x1, a 3x3 head."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 16, 3, 2, 1)
        self.lat, self.out = nn.Conv2d(8, 16, 1), nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        a = F.relu(self.c1(x))
        return self.out(F.interpolate(F.relu(self.c2(a)), scale_factor=2, mode="nearest") + self.lat(a))


class Activations(nn.Module):
    """ReLU6, Hardswish, LeakyReLU, PReLU, ELU and a Clip summed."""

    def __init__(self):
        super().__init__()
        self.c, self.p, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(8), nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        x = self.c(x)
        x = F.relu6(x) + F.hardswish(x) + F.leaky_relu(x, 0.1) + self.p(x) + F.elu(x) + torch.clamp(x, -0.5, 0.5)
        return self.fc(x.flatten(1))


class Mish(nn.Module):
    """Mish (through softplus), a Clip with a minimum only, log-softmax out."""

    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x):
        x = self.c(x)
        x = torch.clamp(x * torch.tanh(F.softplus(x)), min=0.1)
        return F.log_softmax(self.fc(x.mean((2, 3))), -1)


class Pads(nn.Module):
    """Reflect padding, a ceil-mode average pool, a dilated conv, a max pool."""

    def __init__(self):
        super().__init__()
        self.c, self.c2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3, dilation=2, padding=2)

    def forward(self, x):
        x = F.avg_pool2d(self.c(F.pad(x, (1, 1, 1, 1), mode="reflect")), 3, 2, ceil_mode=True)
        return F.max_pool2d(self.c2(x), 2)


class Shuffle(nn.Module):
    """A grouped conv, a transposed conv and a pixel shuffle."""

    def __init__(self):
        super().__init__()
        self.c, self.g = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 16, 3, padding=1, groups=4)
        self.t, self.ps = nn.ConvTranspose2d(16, 8, 2, 2), nn.Conv2d(8, 12, 3, padding=1)

    def forward(self, x):
        return F.pixel_shuffle(self.ps(self.t(F.relu(self.g(self.c(x))))), 2)


class Norms(nn.Module):
    """GroupNorm then InstanceNorm."""

    def __init__(self):
        super().__init__()
        self.c, self.gn, self.inn = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.InstanceNorm2d(8, affine=True)

    def forward(self, x):
        return self.inn(self.gn(self.c(x)))


class CBAM(nn.Module):
    """Channel attention (mean and max pools through a shared MLP) and spatial attention (a 7x7 conv)."""

    def __init__(self):
        super().__init__()
        self.c, self.m1, self.m2 = nn.Conv2d(3, 16, 3, padding=1), nn.Linear(16, 4), nn.Linear(4, 16)
        self.sp = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        x = F.relu(self.c(x))
        a = self.m2(F.relu(self.m1(x.mean((2, 3))))) + self.m2(F.relu(self.m1(x.amax((2, 3)))))
        x = x * torch.sigmoid(a)[:, :, None, None]
        return x * torch.sigmoid(self.sp(torch.cat([x.amax(1, keepdim=True), x.mean(1, keepdim=True)], 1)))


class BiLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(10, 12, batch_first=True, bidirectional=True), nn.Linear(24, 3)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


class Conformer(nn.Module):
    """A Conformer block: half-step FFN, multi-head attention, the GLU / depthwise Conv1d module, LayerNorms."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.inp = nn.Linear(40, d)
        self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
        self.ln_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln_conv, self.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
        self.dw, self.bn, self.pw2 = nn.Conv1d(d, d, 7, padding=3, groups=d), nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
        self.ln_out, self.head = nn.LayerNorm(d), nn.Linear(d, 12)

    def forward(self, x):
        x = self.inp(x)
        x = x + 0.5 * self.ff(x)
        h = self.ln_att(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        c = F.glu(self.pw1(self.ln_conv(x).transpose(1, 2)), dim=1)
        x = x + self.pw2(F.silu(self.bn(self.dw(c)))).transpose(1, 2)
        return self.head(self.ln_out(x).mean(1))


class DetectorHead(nn.Module):
    """A YOLO-style backbone and box decode: sigmoid, the xy / wh transforms, concat."""

    def __init__(self):
        super().__init__()
        self.b = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.LeakyReLU(0.1))
        self.h = nn.Conv2d(32, 3 * 7, 1)

    def forward(self, x):
        p = self.h(self.b(x))
        n, _, hh, ww = p.shape
        p = p.view(n, 3, 7, hh, ww).permute(0, 1, 3, 4, 2)
        xy, wh = torch.sigmoid(p[..., :2]) * 2 - 0.5, (torch.sigmoid(p[..., 2:4]) * 2) ** 2
        return torch.cat([xy, wh, torch.sigmoid(p[..., 4:])], -1).view(n, -1, 7)


class NHWCInput(nn.Module):
    """A TensorFlow-style NHWC image input permuted to NCHW first."""

    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 16, 3, 2, 1), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(F.relu(self.c(x.permute(0, 3, 1, 2))).mean((2, 3)))


class Embeddings(nn.Module):
    """L2-normalised embeddings (F.normalize) from a small conv net."""

    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 16, 3, 2, 1), nn.Linear(16, 8)

    def forward(self, x):
        return F.normalize(self.fc(F.relu(self.c(x)).mean((2, 3))), dim=1)


ZOO: dict[str, tuple[type[nn.Module], tuple]] = {  # each input: a float shape, or ("ids" | "mask", shape)
    "convnext": (ConvNeXt, ((1, 3, 64, 64),)), "mbconv": (MBConv, ((1, 3, 64, 64),)),
    "two_in_two_out": (TwoInTwoOut, ((1, 1, 16, 16), (1, 6))), "embedding": (Embedding, (("ids", (1, 20)),)),
    "masked_mean": (Masked, ((1, 8, 16), ("mask", (1, 8)))), "fpn": (FPN, ((1, 3, 32, 32),)),
    "activations": (Activations, ((1, 3, 16, 16),)), "mish": (Mish, ((1, 3, 16, 16),)), "pads": (Pads, ((1, 3, 31, 31),)),
    "shuffle": (Shuffle, ((1, 3, 16, 16),)), "norms": (Norms, ((1, 3, 16, 16),)), "cbam": (CBAM, ((1, 3, 16, 16),)),
    "bilstm": (BiLSTM, ((1, 20, 10),)), "conformer": (Conformer, ((1, 25, 40),)),
    "detector_head": (DetectorHead, ((1, 3, 64, 64),)), "nhwc_input": (NHWCInput, ((1, 32, 32, 3),)),
    "l2_embeddings": (Embeddings, ((1, 3, 32, 32),)),
}


def example_args(spec: tuple) -> tuple[torch.Tensor, ...]:
    def one(s) -> torch.Tensor:
        if s[0] == "ids":
            return torch.randint(0, 50, s[1])
        if s[0] == "mask":
            return torch.ones(*s[1], dtype=torch.bool)
        return torch.randn(*s)

    return tuple(one(s) for s in spec)


def export(name: str, dynamo: bool, work: Path) -> Path | str:
    """The ONNX file, or why the export failed (a line)."""
    torch.manual_seed(0)
    cls, spec = ZOO[name]
    path = work / f"{name}_{'dynamo' if dynamo else 'torchscript'}.onnx"
    try:
        torch.onnx.export(cls().eval(), example_args(spec), str(path), dynamo=dynamo, opset_version=18 if dynamo else 17)
    except Exception as exc:  # noqa: BLE001 - the exporter's failure is a row of the table
        return f"export failed: {str(exc).splitlines()[0][:120]}"
    return path


def compile_one(path: Path, work: Path) -> list[dict]:
    """Each target's report entry from one `npubuild compile`, or one entry holding the error."""
    proc = subprocess.run([sys.executable, "-m", "npubuild", "compile", str(path), *[a for t in TARGETS for a in ("--target", t)],
                           "--build-dir", str(work / "build"), "--json"], capture_output=True, text=True, timeout=1800)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return [{"status": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:150]}"}]
    return data if isinstance(data, list) else data.get("builds", [data])


def host_op_types(build: dict) -> str:
    m = build.get("metrics") or {}
    offloads = m.get("offloads") or []
    kinds = sorted({o.get("op_type", "?") for o in offloads if isinstance(o, dict) and o.get("kind") == "cpu"})
    return ", ".join(kinds) or "-"


def row(name: str, how: str, b: dict) -> str:
    m = b.get("metrics") or {}

    def f(key: str, fmt: str = "{}") -> str:
        v = m.get(key)
        return "-" if v is None else fmt.format(v)

    return (f"| {name} | {how} | {b.get('target', '-')} | {b.get('status', '-')} | {f('npu_ops')} | {f('host_ops')} | "
            f"{host_op_types(b)} | {f('tosa_max_error_lsb', '{:.0f}')} | {f('tosa_node_max_error_lsb', '{:.0f}')} | "
            f"{f('quant_snr_db', '{:.1f}')} | {f('inference_ms', '{:.4f}')} | {f('transposes')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(ZOO), choices=list(ZOO), metavar="NAME")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="npubuild-zoo-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        lines = ["| model | export | target | status | NPU ops | host ops | on the host | TOSA max LSB | worst node LSB | "
                 "quant SNR dB | inference ms | transposes |", "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
        for name in args.only:
            for dynamo in (False, True):
                how = "dynamo" if dynamo else "torchscript"
                path = export(name, dynamo, work)
                builds = [{"status": path}] if isinstance(path, str) else compile_one(path, work)
                new = [row(name, how, b) for b in builds]
                lines += new
                print("\n".join(new), flush=True)
    passed = sum("| passed |" in ln for ln in lines)
    text = "\n".join([f"`PYTHONPATH=. python bench/export_zoo.py`, torch {torch.__version__}, {len(lines) - 2} builds, "
                      f"{passed} passed, {time.perf_counter() - start:.0f} s.", "", *lines, ""])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
