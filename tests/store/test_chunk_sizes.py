"""The chunk sizes a store records and cuts by (lmzfs/store/catalog/chunksizes.py): a new store cuts
float tensors at 4 MiB and everything else at 1 MiB; a store made before sizes were recorded keeps
cutting every segment at 1 MiB; `lmz add --chunk-size` cuts one add at its own size."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from lmzfs.chunker import FLOAT_DTYPES, LEGACY_SIZES, ChunkSizes
from lmzfs.cli import main as lmz
from lmzfs.codecs.floatsplit import FORMAT_OF
from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.chunksizes import recorded_sizes
from lmzfs.store.layout import StorePaths
from lmzfs.testing.fspaths import PathDriver

MiB = 1 << 20
LEGACY_STORE = Path(__file__).resolve().parents[1] / "fixtures" / "store-v1"


def mixed_model(d: Path, seed: int = 0) -> Path:
    """A safetensors file with a 10 MiB F32 tensor, a 6 MiB F16 one and a 3 MiB int8 one, in that
    order."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {"a.f32": rng.standard_normal(10 * MiB // 4, dtype=np.float32),
               "b.f16": rng.standard_normal(3 * MiB, dtype=np.float32).astype(np.float16),
               "c.i8": rng.integers(-40, 40, 3 * MiB, dtype=np.int8)}
    save_file(tensors, str(d / "model.safetensors"))
    return d


def chunk_lengths(store: StorePaths, model: str, path: str = "model.safetensors") -> list[int]:
    catalog = Catalog(store.catalog, readonly=True)
    try:
        f = next(f for f in catalog.files(model) if f.path == path)
        return [e.size for e in catalog.extents(f.id)]
    finally:
        catalog.close()


def served(store: StorePaths, model: str, path: str = "model.safetensors") -> bytes:
    archive = Archive(store.root)
    try:
        entry = archive.entry(model, path)
        with archive.open(entry) as r:
            return r.pread(0, entry.size)
    finally:
        archive.close()


def test_the_chunkers_float_dtypes_are_exactly_those_floatsplit_codes():
    assert FLOAT_DTYPES == set(FORMAT_OF)


def test_a_new_store_cuts_float_tensors_at_4_mib_and_an_int8_tensor_and_the_header_at_1_mib(tmp_path):
    src = mixed_model(tmp_path / "src")
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")
    raw = (src / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(raw[:8], "little")
    assert chunk_lengths(store, "m") == [header, 4 * MiB, 4 * MiB, 2 * MiB, 4 * MiB, 2 * MiB, MiB, MiB, MiB]
    assert served(store, "m") == raw
    catalog = Catalog(store.catalog, readonly=True)
    try:
        assert catalog.chunk_sizes() == ChunkSizes(other=MiB, floats=4 * MiB)
    finally:
        catalog.close()


def test_a_store_made_before_sizes_were_recorded_keeps_cutting_every_segment_at_1_mib(tmp_path, capsys):
    store = StorePaths(shutil.copytree(LEGACY_STORE, tmp_path / "store"))
    src = mixed_model(tmp_path / "src")
    add_model(store, src, "m")
    add_model(store, src, "again")
    raw = (src / "model.safetensors").read_bytes()
    assert chunk_lengths(store, "m")[1:] == [MiB] * 19
    assert chunk_lengths(store, "again") == chunk_lengths(store, "m")
    assert served(store, "again") == raw
    with sqlite3.connect(store.catalog) as db:
        assert db.execute("SELECT COUNT(*) FROM meta WHERE key LIKE '%chunk_size'").fetchone() == (0,)
    assert lmz(["--store", str(store.root), "doctor"]) in (0, 1)
    assert "chunk sizes    every segment at 1.0 MiB" in capsys.readouterr().out


def test_lmz_add_chunk_size_cuts_that_add_at_its_size_and_the_next_add_by_the_stores(tmp_path):
    src = mixed_model(tmp_path / "src")
    store = StorePaths(tmp_path / "store")
    assert lmz(["--store", str(store.root), "add", "--chunk-size", "2M", str(src), "--name", "two"]) == 0
    assert lmz(["--store", str(store.root), "add", str(src), "--name", "default"]) == 0
    assert chunk_lengths(store, "two")[1:] == [2 * MiB] * 9 + [MiB]
    assert chunk_lengths(store, "default")[1:] == [4 * MiB, 4 * MiB, 2 * MiB, 4 * MiB, 2 * MiB, MiB, MiB, MiB]
    assert served(store, "two") == served(store, "default") == (src / "model.safetensors").read_bytes()


def test_a_writable_mounts_commits_cut_by_the_stores_sizes(tmp_path):
    src = mixed_model(tmp_path / "src")
    raw = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    fs = Filesystem(store.root, cache_bytes=16 << 20, workers=2)
    try:
        p = PathDriver(fs)
        p.mkdir("w")
        p.write_file("w/model.safetensors", raw)
    finally:
        fs.close()
    assert chunk_lengths(store, "w")[1:] == [4 * MiB, 4 * MiB, 2 * MiB, 4 * MiB, 2 * MiB, MiB, MiB, MiB]
    assert served(store, "w") == raw
    add_model(store, src, "added")                  # the same tensors: every chunk already stored
    assert chunk_lengths(store, "added") == chunk_lengths(store, "w")


def test_a_damaged_recorded_size_is_one_line_and_verify_repair_restores_it(tmp_path, capsys):
    src = mixed_model(tmp_path / "src")
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")
    with sqlite3.connect(store.catalog) as db:
        db.execute("UPDATE meta SET value = '4194305x' WHERE key = 'float_chunk_size'")
    capsys.readouterr()
    for argv in (["verify"], ["add", str(src), "--name", "n"]):
        assert lmz(["--store", str(store.root), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is damaged: run lmz verify --repair" in err, (argv, err)
        if argv == ["verify"]:
            assert "(meta's float_chunk_size reads '4194305x', not a chunk size of 65536 to 16777216 bytes)" in err
    assert lmz(["--store", str(store.root), "doctor"]) == 1
    assert "float_chunk_size reads '4194305x'" in capsys.readouterr().out
    with sqlite3.connect(store.catalog) as db:       # a value of another type than text
        db.execute("UPDATE meta SET value = X'34313934333034' WHERE key = 'float_chunk_size'")
    assert lmz(["--store", str(store.root), "doctor"]) == 1
    out = capsys.readouterr().out
    assert "is damaged: run lmz verify --repair" in out and "1 problem(s) found" in out
    assert lmz(["--store", str(store.root), "verify", "--repair"]) == 0
    assert lmz(["--store", str(store.root), "add", str(src), "--name", "n"]) == 0
    assert chunk_lengths(store, "n") == chunk_lengths(store, "m")
    assert served(store, "n") == (src / "model.safetensors").read_bytes()


def test_recorded_sizes_refuse_a_value_that_is_not_text_and_read_a_catalog_without_them_as_1_mib():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    assert recorded_sizes(db) == LEGACY_SIZES == ChunkSizes(MiB, MiB)
    db.execute("INSERT INTO meta VALUES ('chunk_size', '1048576'), ('float_chunk_size', X'34313934333034')")
    with pytest.raises(ValueError, match=r"float_chunk_size reads b'4194304'"):
        recorded_sizes(db)
    db.execute("UPDATE meta SET value = '4194304' WHERE key = 'float_chunk_size'")
    assert recorded_sizes(db) == ChunkSizes(other=MiB, floats=4 * MiB)
