"""Every chunk read is checked against a checksum of its plain bytes: XXH3-128 kept in the
catalog (version 2), or the SHA-256 id itself for chunks stored before there was one (version 1
catalogs, read as they are and upgraded by the next writer)."""
from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
import xxhash

from lmzfs.cli import main as lmz
from lmzfs.codecs import ChunkHint, encode_chunk
from lmzfs.doctor import check_store
from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog, Extent
from lmzfs.store.read.chunkread import read_chunk
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.packbackend import LocalPacks
from lmzfs.admin.verify import verify_store
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model


def chunk_rows(store: StorePaths) -> dict[bytes, bytes | None]:
    """chunk id -> its xxh3 column (None where empty)."""
    db = sqlite3.connect(store.catalog)
    try:
        return dict(db.execute("SELECT id, xxh3 FROM chunks"))
    finally:
        db.close()


def plain_chunks(store_dir: Path) -> dict[bytes, bytes]:
    """chunk id -> plain bytes, for every chunk of every file (read through the reader)."""
    return plain_chunks_of(store_dir, None)


def plain_chunks_of(store_dir: Path, model: str | None) -> dict[bytes, bytes]:
    """chunk id -> plain bytes, for every chunk of the model's files (every model's if None)."""
    archive = Archive(store_dir, workers=0)
    cat = Catalog(StorePaths(store_dir).catalog, readonly=True)
    try:
        out = {}
        for entry in (e for e in archive.files() if model is None or e.model == model):
            with archive.open(entry) as r:
                for x in cat.extents(entry.file_id):
                    out[x.chunk_id] = r.pread(x.offset, x.size)
        return out
    finally:
        cat.close()
        archive.close()


def alter_catalog(store: StorePaths, *statements: str | tuple[str, tuple]) -> None:
    """Run SQL statements (text, or (text, parameters)) on the catalog behind lmzfs's back, as an
    lmzfs that kept no catalog copies would have (copies of the state before would tell this
    change from damage)."""
    for copy in store.root.glob("catalog.sqlite.copy-*"):
        copy.unlink()
    db = sqlite3.connect(store.catalog)
    try:
        for st in statements:
            db.execute(*((st,) if isinstance(st, str) else st))
        db.commit()
    finally:
        db.close()


def downgrade_to_version_1(store: StorePaths) -> None:
    """What a store written before read checksums looks like: no xxh3 column, catalog version 1."""
    alter_catalog(store, "DROP INDEX chunks_by_base", "ALTER TABLE chunks DROP COLUMN base", "DROP TABLE tensors",
                  "ALTER TABLE chunks DROP COLUMN xxh3",
                  "UPDATE meta SET value = '1' WHERE key = 'catalog_version'")


def catalog_version(store: StorePaths) -> str:
    db = sqlite3.connect(store.catalog)
    try:
        return db.execute("SELECT value FROM meta WHERE key = 'catalog_version'").fetchone()[0]
    finally:
        db.close()


def test_every_new_chunk_carries_the_xxh3_of_its_plain_bytes(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=1), "a")
    rows = chunk_rows(store)
    plain = plain_chunks(store_dir)
    assert len(rows) >= 4 and set(plain) == set(rows)
    for cid, check in rows.items():
        assert hashlib.sha256(plain[cid]).digest() == cid
        assert check == xxhash.xxh3_128_digest(plain[cid])


def test_a_wrong_read_checksum_is_eio_not_wrong_bytes_and_verify_names_the_file(tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=2)
    add_model(store, a, "a")
    archive = Archive(store_dir)
    try:
        entry = archive.entry("a", "model.safetensors")
    finally:
        archive.close()
    cat = Catalog(store.catalog, readonly=True)
    victim = max(cat.extents(entry.file_id), key=lambda x: x.size)
    cat.close()
    alter_catalog(store, ("UPDATE chunks SET xxh3 = ? WHERE id = ?", (bytes(16), victim.chunk_id)))
    archive = Archive(store_dir)
    try:
        with archive.open(archive.entry("a", "model.safetensors")) as r:
            # the whole chunk (in a store added with --segments, a lone read of one floatseg segment
            # is checked by that segment's CRC-32, not by the chunk's checksum)
            with pytest.raises(CorruptChunk) as info:
                r.pread(victim.offset, victim.size)
            assert info.value.errno == 5
            assert r.pread(0, 64) == (a / "model.safetensors").read_bytes()[:64]
    finally:
        archive.close()
    assert lmz(["--store", str(store_dir), "verify"]) == 1
    assert "DAMAGED a/model.safetensors" in capsys.readouterr().out


def test_bytes_that_match_the_read_checksum_but_not_the_id_are_refused_when_the_id_is_checked(tmp_path, store_dir):
    # The payload holds other bytes than the chunk id names, with their own (matching) checksum:
    # reads trust the checksum; `lmz verify` (check_id) catches the mismatch with the id.
    store = StorePaths(store_dir)
    store.create()
    named, stored = b"the bytes the id names " * 100, b"some other bytes stored " * 100
    cid = hashlib.sha256(named).digest()
    packs = LocalPacks(store)
    writer = packs.appender(None, 1)
    loc = writer.append(cid, encode_chunk(stored, ChunkHint()).payload)
    writer.seal()
    writer.close()
    extent = Extent(0, len(stored), cid, "zstd", loc, xxhash.xxh3_128_digest(stored))
    fd = packs.open_read(loc.pack)
    try:
        assert read_chunk(fd, extent) == stored
        with pytest.raises(CorruptChunk, match="do not match"):
            read_chunk(fd, extent, check_id=True)
        without = Extent(0, len(stored), cid, "zstd", loc, None)     # a version 1 chunk: the id is the check
        with pytest.raises(CorruptChunk, match="do not match"):
            read_chunk(fd, without)
    finally:
        os.close(fd)


def test_a_version_1_catalog_is_read_by_sha256_and_the_next_add_upgrades_it_and_fills_in_checksums(
        tmp_path, store_dir):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=3)
    add_model(store, a, "a")
    downgrade_to_version_1(store)
    # read as it is, without writing to it: every chunk checked by its SHA-256 id
    archive = Archive(store_dir)
    try:
        with archive.open(archive.entry("a", "model.safetensors")) as r:
            assert r.pread(0, r.size) == (a / "model.safetensors").read_bytes()
    finally:
        archive.close()
    cat = Catalog(store.catalog, readonly=True)
    assert not cat.has_xxh3 and all(x.xxh3 is None for f in cat.files("a") for x in cat.extents(f.id))
    cat.close()
    assert catalog_version(store) == "1" and verify_store(store).ok
    problems: list[str] = []
    health = check_store(store, problems)
    assert not problems and health["catalog_version"] == "1"
    assert health["chunks_checked_by_sha256"] == health["chunks"] >= 4
    # the next writer upgrades it; adding the same content again fills in the old chunks' checksums
    add_model(store, small_model(tmp_path / "b", seed=4), "b")
    assert catalog_version(store) == "3"
    rows = chunk_rows(store)
    old = {cid for cid, check in rows.items() if check is None}
    assert old and len(old) < len(rows)
    add_model(store, a, "a-again")
    assert all(check is not None for check in chunk_rows(store).values())
    assert plain_chunks(store_dir) and verify_store(store).ok


def test_a_reader_of_a_version_1_catalog_sees_checksums_once_a_writer_upgrades_it(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=5), "a")
    downgrade_to_version_1(store)
    cat = Catalog(store.catalog, readonly=True)
    try:
        f = next(f for f in cat.files("a") if f.path == "model.safetensors")
        assert all(x.xxh3 is None for x in cat.extents(f.id))
        add_model(store, small_model(tmp_path / "a", seed=5), "a-again")    # upgrades, fills in
        assert all(x.xxh3 is not None for x in cat.extents(f.id))
    finally:
        cat.close()


def test_a_catalog_of_an_unknown_version_is_refused(tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", mib=1), "a")
    alter_catalog(store, "UPDATE meta SET value = '4' WHERE key = 'catalog_version'")
    with pytest.raises(StoreError, match="version 4 is not supported"):
        Archive(store_dir)
    assert lmz(["--store", str(store_dir), "ls"]) == 2
    assert "version 4 is not supported" in capsys.readouterr().err


def test_verify_record_checksums_gives_old_chunks_theirs_and_leaves_a_damaged_one_without(tmp_path, store_dir,
                                                                                          capsys):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=6), small_model(tmp_path / "b", seed=7)
    add_model(store, a, "a")
    add_model(store, b, "b")
    downgrade_to_version_1(store)
    bad_offset = flip_byte_in_chunk_of(store, "b", "model.safetensors")
    assert lmz(["--store", str(store_dir), "verify", "--record-checksums"]) == 1
    out = capsys.readouterr().out
    assert catalog_version(store) == "3"
    rows = chunk_rows(store)
    missing = [cid for cid, check in rows.items() if check is None]
    assert len(missing) == 1 and f"DAMAGED chunk {missing[0].hex()[:16]}" in out
    assert "DAMAGED b/model.safetensors" in out and "DAMAGED a/" not in out
    plain = plain_chunks_of(store_dir, "a")
    assert plain and all(rows[cid] == xxhash.xxh3_128_digest(data) for cid, data in plain.items())
    archive = Archive(store_dir)
    try:
        with archive.open(archive.entry("b", "model.safetensors")) as r:
            with pytest.raises(CorruptChunk):
                r.pread(bad_offset, 4096)
    finally:
        archive.close()
    # a second run has nothing left to record but the damaged chunk, which it still refuses
    assert lmz(["--store", str(store_dir), "verify", "--record-checksums", "a"]) == 1
    assert "recorded for 0 chunk(s)" in capsys.readouterr().out


def test_a_version_3_catalog_without_its_checksum_column_is_called_damaged(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", mib=1), "a")
    alter_catalog(store, "ALTER TABLE chunks DROP COLUMN xxh3")
    with pytest.raises(StoreError, match=r"is damaged: run lmz verify --repair \(version 3 lacks the chunks.xxh3 column\)"):
        Archive(store_dir)
