"""The atomic writer: the mode a plain ``open()`` would give, no umask flipping, the directory
fsynced after the rename, and nothing left behind when a write fails."""

from __future__ import annotations

import os
import stat

import pytest

from openclaw_ref.core import jsonio
from openclaw_ref.core.jsonio import read_json, write_json_atomic, write_text_atomic


def test_a_new_file_gets_the_mode_open_would_give_under_the_current_umask(tmp_path):
    old = os.umask(0o027)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        atomic = write_text_atomic(tmp_path / "atomic.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o640


def test_the_writer_never_reads_or_sets_the_process_umask(tmp_path, monkeypatch):
    def _refuse(_mask):
        raise AssertionError("os.umask called")

    monkeypatch.setattr(jsonio.os, "umask", _refuse)
    write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert read_json(tmp_path / "a.json") == {"x": 1}


def test_the_directory_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    synced: list[tuple[bool, bool]] = []
    real_fsync = os.fsync
    target = tmp_path / "out.txt"

    def _record(fd):
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(jsonio.os, "fsync", _record)
    write_text_atomic(target, "x")
    assert synced == [(False, False), (True, True)]


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = write_text_atomic(tmp_path / "out.txt", "old")

    def _fail(_src, _dst):
        raise OSError("disk gone")

    monkeypatch.setattr(jsonio.os, "replace", _fail)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
