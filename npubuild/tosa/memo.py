"""Outputs of the runs one stage made that a later stage would make again, kept by what they were run on.

The tosa-check stage runs model.tosa and each bit-identical family's graph on the TOSA reference model, and
the float and QDQ models on onnxruntime, on its samples; the npu-sim stage runs the graph Vela compiled (one
of those) and the same two ONNX models on the same samples again, once per target (a real model's build:
palm detection, 3 targets, 3 of its 23 whole-graph reference-model runs and every onnxruntime run of its three
npu-sim tasks). npu-sim also holds a sample to model.tosa's kept run where its outputs are those bit for bit, and
runs the target's own graph only where they differ (npusim.verify.compare: on palm none of the 9 runs left).
tosa-check writes what it ran to runs.npz, a declared output that npu-sim declares as an input
(so the engine's up-to-date check reruns tosa-check, and then npu-sim, when the file is damaged or gone), and
npu-sim takes an output from it only where the key matches: a digest of the graph's or model file's bytes and
of every input array's dtype, shape and bytes. A run that is not there is made as before: the memo changes
what runs, never what a run gives (both tools are deterministic on one machine).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npubuild.fileio import atomic_path

INDEX = "index"


def _digest_arrays(h, arrays: Sequence[tuple[str, np.ndarray]]) -> str:
    for name, a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:40]


def graph_key(graph: bytes, arrays: Sequence[np.ndarray]) -> str:
    """The key of a TOSA reference-model run: the graph's bytes and its input arrays in order."""
    h = hashlib.sha256(b"tosa|")
    h.update(hashlib.sha256(graph).digest())
    return "tosa-" + _digest_arrays(h, [(str(i), a) for i, a in enumerate(arrays)])


def model_key(model_digest: bytes, options: str, feeds: dict[str, np.ndarray]) -> str:
    """The key of an onnxruntime run: the model file's digest, the session's options and the feeds by name."""
    h = hashlib.sha256(b"onnx|")
    h.update(model_digest)
    h.update(options.encode())
    return "onnx-" + _digest_arrays(h, sorted((k, np.asarray(v)) for k, v in feeds.items()))


class RunMemo:
    """Run key -> the run's outputs (name -> array, in the run's order), with the file they are kept in."""

    def __init__(self, entries: dict[str, dict[str, np.ndarray]] | None = None):
        self.entries: dict[str, dict[str, np.ndarray]] = dict(entries or {})

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """A copy of the outputs kept under `key` (a caller may write into what it gets), or None."""
        got = self.entries.get(key)
        return None if got is None else {k: v.copy() for k, v in got.items()}

    def put(self, key: str, outputs: dict[str, np.ndarray]) -> None:
        self.entries[key] = {k: np.array(v) for k, v in outputs.items()}

    def update(self, other: RunMemo) -> None:
        self.entries.update(other.entries)

    def write(self, path: Path) -> None:
        """runs.npz: each output as member `<n>`, with an index of key -> [[output name, member], ...]."""
        index: dict[str, list[list[str]]] = {}
        arrays: dict[str, np.ndarray] = {}
        for key in sorted(self.entries):
            index[key] = []
            for name, value in self.entries[key].items():
                member = f"a{len(arrays)}"
                arrays[member] = value
                index[key].append([name, member])
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **{INDEX: np.array(json.dumps(index, sort_keys=True))}, **arrays)

    @classmethod
    def read(cls, path: Path | None) -> RunMemo:
        """The memo a stage wrote; empty where there is none (no such input)."""
        if path is None:
            return cls()
        with np.load(path, allow_pickle=False) as z:
            index = json.loads(str(z[INDEX]))
            return cls({key: {name: z[member] for name, member in outputs} for key, outputs in index.items()})
