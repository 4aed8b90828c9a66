"""The comparison's temporary directory holds its socket: a ``$TMPDIR`` too deep for an
AF_UNIX path (108 bytes) sends it to ``/tmp``; a short one keeps it."""

import shutil
import tempfile
from pathlib import Path

import pytest

from pytest_accelperf.ab.tree import SOCKET_PATH_MAX, socket_dir


def test_a_deep_tmpdir_puts_the_socket_directory_under_tmp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    made = socket_dir("accelperf-compare-", "socket")
    try:
        assert made.parent == Path("/tmp")
        assert len(str(made / "socket").encode()) <= SOCKET_PATH_MAX
    finally:
        shutil.rmtree(made)


def test_a_short_tmpdir_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    short = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    made = socket_dir("accelperf-compare-", "socket")
    try:
        assert made.parent == short
    finally:
        shutil.rmtree(short)
