"""A writable mount's commits code text quickly and the mount codes it as `lmz add` would once
idle (lmzfs/fsmodel/recodetext.py), driven without FUSE; the fs_text_chunks table that names
what is left (writable-mount tables, fs version 2)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmzfs.admin.verify import verify_store
from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.testing.fspaths import PathDriver
from lmzfs.testing.synthetic import live_payload_bytes, log_text, payload_sizes


def open_fs(store: Path, *, background: bool = False) -> Filesystem:
    return Filesystem(store, cache_bytes=16 << 20, workers=2, background_commits=background)


def text_sizes(text: bytes) -> tuple[int, int]:
    """(payload a commit codes the text to, payload `lmz add` codes it to)."""
    quick, smallest = payload_sizes(text)
    assert smallest < quick < len(text) // 2
    return quick, smallest


def with_a_log_written(fs: Filesystem, text: bytes) -> PathDriver:
    p = PathDriver(fs)
    p.mkdir("logs")
    p.write_file("logs/train.log", text)
    return p


def test_a_commit_codes_text_quickly_and_an_idle_pass_codes_it_as_lmz_add_would(store_dir):
    text = log_text(3000)
    quick, smallest = text_sizes(text)
    fs = open_fs(store_dir)
    try:
        p = with_a_log_written(fs, text)
        assert live_payload_bytes(store_dir) == quick
        assert fs.text_chunks_pending() == 1
        assert fs.recode_text() == 1
        assert fs.text_chunks_pending() == 0
        assert live_payload_bytes(store_dir) == smallest
        assert p.read_file("logs/train.log") == text
    finally:
        fs.close()
    assert PathDriver(reopened := open_fs(store_dir)).read_file("logs/train.log") == text
    reopened.close()
    assert verify_store(StorePaths(store_dir)).ok


def test_the_idle_recode_waits_while_files_are_read_and_runs_once_they_are_not(store_dir):
    import time
    from lmzfs.testing.mount import wait_for
    text = log_text(3000)
    quick, smallest = text_sizes(text)
    fs = open_fs(store_dir, background=True)
    try:
        p = with_a_log_written(fs, text)
        wait_for(lambda: live_payload_bytes(store_dir) == quick, 30, "the commit")
        end = time.monotonic() + 4.0                # twice the idle time, reading all along
        while time.monotonic() < end:
            assert p.read_file("logs/train.log") == text
            time.sleep(0.1)
        assert live_payload_bytes(store_dir) == quick
        wait_for(lambda: live_payload_bytes(store_dir) == smallest, 30, "the idle recode")
        assert fs.text_chunks_pending() == 0
    finally:
        fs.close()


def test_text_chunks_left_coded_quickly_at_unmount_are_named_to_the_next_mount_and_rewrite_recode_codes_them(
        store_dir):
    from lmzfs.store.rewrite.recode import recode_store
    text = log_text(3000)
    quick, smallest = text_sizes(text)
    fs = open_fs(store_dir)
    try:
        with_a_log_written(fs, text)
    finally:
        fs.close()
    assert live_payload_bytes(store_dir) == quick
    fs = open_fs(store_dir)
    try:
        assert fs.text_chunks_pending() == 1            # fs_text_chunks: the commit named it
    finally:
        fs.close()
    recode_store(StorePaths(store_dir))
    assert live_payload_bytes(store_dir) == smallest
    fs = open_fs(store_dir)
    try:
        assert fs.text_chunks_pending() == 0            # the pass tried it: no longer named
        assert fs.recode_text() == 0
        assert PathDriver(fs).read_file("logs/train.log") == text
    finally:
        fs.close()
    fs = open_fs(store_dir)
    try:
        assert fs.text_chunks_pending() == 0
    finally:
        fs.close()


def test_text_files_committed_together_at_unmount_are_each_named_and_recoded_by_the_next_mount(store_dir):
    texts = [log_text(800, seed) for seed in (1, 2, 3)]
    sizes = [text_sizes(t) for t in texts]
    fs = open_fs(store_dir, background=True)
    try:
        p = PathDriver(fs)
        p.mkdir("logs")
        for i, text in enumerate(texts):
            fh = p.open(f"logs/{i}.log", os.O_WRONLY | os.O_CREAT)
            fs.write(fh, 0, text)
        # the files stay open: the unmount commits them, together (one pack session, one transaction)
    finally:
        fs.close()
    assert live_payload_bytes(store_dir) == sum(quick for quick, _ in sizes)
    fs = open_fs(store_dir)
    try:
        assert fs.text_chunks_pending() == 3
        assert fs.recode_text() == 3
        assert live_payload_bytes(store_dir) == sum(smallest for _, smallest in sizes)
        assert [PathDriver(fs).read_file(f"logs/{i}.log") for i in range(3)] == texts
    finally:
        fs.close()


def set_fs_version(store: Path, version: str, *, drop_text_chunks: bool = False) -> None:
    import sqlite3
    db = sqlite3.connect(StorePaths(store).catalog)
    with db:
        if drop_text_chunks:
            db.execute("DROP TABLE fs_text_chunks")
        db.execute("UPDATE meta SET value = ? WHERE key = 'fs_version'", (version,))
        # a change as another lmzfs would make it: a new generation (the copy beside is an older one)
        db.execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'generation'")
    db.close()


def test_a_store_with_writable_tables_of_version_1_gets_version_2_and_one_of_version_3_is_refused(store_dir):
    fs = open_fs(store_dir)
    PathDriver(fs).mkdir("m")
    fs.close()
    set_fs_version(store_dir, "1", drop_text_chunks=True)
    fs = open_fs(store_dir)
    try:
        assert PathDriver(fs).listdir("") == ["m"]
        assert fs.text_chunks_pending() == 0
    finally:
        fs.close()
    catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
    try:
        assert catalog.db.execute("SELECT value FROM meta WHERE key = 'fs_version'").fetchone() == ("2",)
        assert catalog.db.execute("SELECT COUNT(*) FROM fs_text_chunks").fetchone() == (0,)
    finally:
        catalog.close()
    set_fs_version(store_dir, "3")
    with pytest.raises(StoreError, match="writable-mount tables are version 3; this lmzfs knows versions 1, 2"):
        open_fs(store_dir)
