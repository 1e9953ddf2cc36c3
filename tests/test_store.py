"""npubuild/store.py on real files: reads verify every byte, the size bound removes the least recently read
entries by the sizes their manifests give, and a local store never imports fsspec. (The stage cache's own
checks over it: tests/engine/test_cache_trust.py, test_content_keys.py; the Vela cache's: tests/ethosu.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from npubuild.store import DEBRIS_GRACE_S, MANIFEST, Store

REPO = Path(__file__).resolve().parents[1]
KEYS = ("a1" * 20, "b2" * 20, "c3" * 32)  # stage cache keys are 40 hex digits, the Vela cache's 64


def _entry(store: Store, key: str) -> Path:
    return Path(store.root) / key[:2] / key


def test_a_read_gives_the_bytes_put_and_a_damaged_entry_is_discarded(tmp_path: Path):
    store = Store(tmp_path / "s")
    store.put_files(KEYS[2], {"stdout": b"hello", "out/m.tflite": b"\x00" * 3000}, {})
    assert store.read(KEYS[2], {"stdout"}, 1 << 20) == {"stdout": b"hello", "out/m.tflite": b"\x00" * 3000}
    assert store.read(KEYS[2], {"stdout"}, 1000) is None and store.has(KEYS[2])  # too big to hold: left, unread
    assert store.read(KEYS[2], {"stderr"}, 1 << 20) is None and not store.has(KEYS[2])  # lacks a file: discarded

    store.put_files(KEYS[2], {"stdout": b"hello"}, {})
    manifest = json.loads((_entry(store, KEYS[2]) / MANIFEST).read_text())
    (_entry(store, KEYS[2]) / manifest["files"]["stdout"]["path"]).write_bytes(b"hellO")
    assert store.read(KEYS[2], set(), 1 << 20) is None and not _entry(store, KEYS[2]).exists()


def test_the_size_bound_removes_the_least_recently_read_by_their_manifests_sizes(tmp_path: Path):
    store = Store(tmp_path / "s")
    for i, key in enumerate(KEYS):
        store.put_files(key, {"f": bytes(1000)}, {})
        os.utime(_entry(store, key) / MANIFEST, (100.0 * (i + 1),) * 2)  # written long ago, KEYS[0] first
    killed = _entry(store, KEYS[1]) / "0123abcd"  # a killed writer's dir, older than the grace
    killed.mkdir()
    (killed / "f").write_bytes(bytes(5000))  # not an entry's: not counted, swept
    os.utime(killed, (0.0, 0.0))
    assert store.read(KEYS[0], {"f"}, 1 << 20) == {"f": bytes(1000)}  # read now: the most recently used

    assert store.prune_size(3000, grace_s=DEBRIS_GRACE_S) == 0  # within the bound: the debris alone goes
    assert store.keys() == sorted(KEYS) and not killed.exists()
    assert store.prune_size(2500, 1500) == 2 and store.keys() == [KEYS[0]]


def test_a_local_store_never_imports_fsspec(tmp_path: Path):
    code = f"""
import sys
from pathlib import Path
from npubuild.store import Store
s = Store({str(tmp_path / 's')!r})
src = Path({str(tmp_path / 'src')!r}); (src / 'sub').mkdir(parents=True); (src / 'sub' / 'a').write_bytes(b'x')
s.put({KEYS[0]!r}, src, {{}}, set())
s.put_files({KEYS[1]!r}, {{'b': b'y'}}, {{}})
assert s.get({KEYS[0]!r}, Path({str(tmp_path / 'dest')!r}), {{'sub/a'}}) is not None
assert s.read({KEYS[1]!r}, {{'b'}}, 10) == {{'b': b'y'}}
assert s.verify() == (2, []) and s.stats()['entries'] == 2 and s.debris(0.0) == []
assert s.prune_size(1, 0, grace_s=0.0) == 2 and s.prune(0.0) == 0 and s.keys() == []
print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 'asyncio')))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
