"""content_hash: a file's sha256 remembered for one build by its identity and stat signature, hashed afresh
whenever a write (through the kernel: its ctime moves) or a new build could have changed it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from npubuild.engine import uptodate
from npubuild.engine.uptodate import content_hash, forget_hashes


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """The files content_hash really reads (fileio.file_hash's calls)."""
    seen: list[Path] = []
    real = uptodate.file_hash

    def counted(path: Path) -> str:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(uptodate, "file_hash", counted)
    forget_hashes()
    yield seen
    forget_hashes()


def test_the_same_file_is_read_once_a_build(tmp_path: Path, reads: list[Path]):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc" * 1000)
    first, second = content_hash(f), content_hash(f)
    assert first[1] == second[1] == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert reads == [f]
    forget_hashes()  # a new build
    assert content_hash(f)[1] == first[1] and reads == [f, f]


def test_a_rewrite_of_the_same_size_with_its_mtime_put_back_is_hashed_again(tmp_path: Path, reads: list[Path]):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    st = f.stat()
    before = content_hash(f)[1]
    f.write_bytes(b"abd")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # what utime cannot put back is the ctime
    now = f.stat()
    if (now.st_ino, now.st_ctime_ns) == (st.st_ino, st.st_ctime_ns):  # a kernel with coarse timestamps, one tick
        pytest.skip("this filesystem gave both writes one ctime: no stat signature can tell them apart")
    after = content_hash(f)[1]
    assert after == hashlib.sha256(b"abd").hexdigest() != before
    assert reads == [f, f]


def test_a_replaced_file_is_hashed_again(tmp_path: Path, reads: list[Path]):
    f, tmp = tmp_path / "a.bin", tmp_path / ".a.tmp"
    f.write_bytes(b"one")
    content_hash(f)
    tmp.write_bytes(b"two")
    os.replace(tmp, f)  # as fileio.atomic_path writes: a new inode at the same path
    assert content_hash(f)[1] == hashlib.sha256(b"two").hexdigest()
