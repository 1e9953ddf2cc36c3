"""Load Vela's raw output (.npz) into a `RawModel`, without unpickling anything."""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npubuild.config.accelerator import Accelerator, CommandStream, from_driver_header
from npubuild.errors import InputError

DA_CONFIG, DA_CMD_STREAM, DA_READ_APB, DA_DUMP_SHRAM, DA_NOP = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class TensorPlace:
    """Where Vela put one input or output: region, byte offset, shape (NHWC; Vela's raw output pads it to six
    dimensions) and element size."""

    shape: tuple[int, ...]
    elem_size: int
    region: int
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.elem_size


@dataclass
class RawModel:
    path: str
    accelerator: str
    ncores: int
    commands: np.ndarray  # uint32 command words (the driver header removed)
    weights: bytes
    weight_region: int
    scratch_region: int
    scratch_size: int
    fast_region: int
    fast_size: int
    shram_kib: int = 48  # per core
    inputs: list[TensorPlace] = field(default_factory=list)
    outputs: list[TensorPlace] = field(default_factory=list)
    # the decoded command stream, kept between runs of this model (a sample each: npu-sim's check runs four)
    decoded: list = field(default_factory=list, compare=False, repr=False)

    @property
    def generation(self) -> CommandStream:
        """Whose command stream this is: u55 (U55 and U65 share one) or u85."""
        return Accelerator.parse(self.accelerator).facts.command_stream


def accelerator_of(product: int, log2_macs: int, where: str) -> tuple[str, int]:
    """The accelerator and core count a driver header names (config/accelerator.py: U65-512 two cores; U85:
    weight decoders, a weight stream each), or bad input."""
    acc = from_driver_header(product, log2_macs)
    if acc is None:
        raise InputError(f"unsupported accelerator in driver header (product {product}, 2^{log2_macs} MACs)", where)
    return acc.name, acc.cores


def parse_driver_payload(data: bytes, where: str) -> tuple[np.ndarray, int, int, int]:
    """Split the COP1 driver payload: (command words, product, log2 MACs/cycle, SHRAM KiB of all cores)."""
    if len(data) < 8 or data[:4] != b"COP1":
        raise InputError("cmd_data has no COP1 driver header", where)
    data = data + b"\0" * (-len(data) % 4)
    words = np.frombuffer(data, dtype="<u4")
    i, product, macs, shram = 1, None, None, 0
    while i < len(words):
        tag = int(words[i])
        kind, param = tag & 0xFF, tag >> 16
        if kind == DA_CONFIG:
            config = int(words[i + 1])
            macs, product, shram = config & 0xF, config >> 28, (config >> 8) & 0xFF
            i += 3
        elif kind == DA_CMD_STREAM:
            length = ((tag >> 8) & 0xFF) << 16 | param
            if product is None:
                raise InputError("driver payload has no CONFIG before the command stream", where)
            return words[i + 1:i + 1 + length].copy(), product, macs, shram
        elif kind in (DA_NOP, DA_DUMP_SHRAM):
            i += 1
        elif kind == DA_READ_APB:
            i += 1
        else:
            raise InputError(f"unknown driver action {kind:#x} in cmd_data", where)
    raise InputError("driver payload has no command stream", where)


def _bytes(z: np.lib.npyio.NpzFile, key: str) -> bytes:
    return z[key].tobytes()


def _places(z, prefix: str) -> list[TensorPlace]:
    shapes = z[f"{prefix}_shape"]
    return [TensorPlace(tuple(int(d) for d in shapes[i]), int(z[f"{prefix}_elem_size"][i]),
                        int(z[f"{prefix}_region"][i]), int(z[f"{prefix}_offset"][i])) for i in range(len(shapes))]


def load_raw(path: str | Path) -> RawModel:
    """Read a `*_vela.npz`; bad files are an InputError naming the file."""
    where = str(path)
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, struct.error) as exc:
        raise InputError(f"not a Vela raw .npz: {exc}", where) from None
    need = ("cmd_data", "weight_data", "scratch_size", "input_shape", "output_shape")
    missing = [k for k in need if k not in z.files]
    if missing:
        raise InputError(f"not a Vela raw .npz: missing {', '.join(missing)}", where)
    words, product, macs, shram = parse_driver_payload(_bytes(z, "cmd_data"), where)
    accel, ncores = accelerator_of(product, macs, where)
    return RawModel(where, accel, ncores, words, _bytes(z, "weight_data"), int(z["weight_region"]),
                    int(z["scratch_region"]), int(z["scratch_size"]), int(z["scratch_fast_region"]),
                    int(z["scratch_fast_size"]), max(shram // ncores, 16), _places(z, "input"), _places(z, "output"))
