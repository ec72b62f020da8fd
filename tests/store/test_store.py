"""Store layer: add, ls, rm, gc, verify, crash safety and damage, called as functions and via the CLI."""
from __future__ import annotations

import hashlib
import os
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lmzfs.cli import main as lmz
from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.admin.verify import verify_store
from lmzfs.testing.killpoints import kill_at_point
from lmzfs.testing.smalldisk import fill, free_bytes
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_names(store: StorePaths) -> list[str]:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return [m.name for m in cat.models()]
    finally:
        cat.close()


def pack_bytes(store: StorePaths) -> int:
    return sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp"))


def read_all(store_dir: Path) -> dict[str, bytes]:
    archive = Archive(store_dir)
    try:
        out = {}
        for e in archive.files():
            with archive.open(e) as r:
                out[f"{e.model}/{e.path}"] = r.pread(0, e.size)
        return out
    finally:
        archive.close()


def test_a_real_model_dir_round_trips_and_the_copy_costs_no_payload(model_dir, store_dir, capsys):
    store = StorePaths(store_dir)
    result = add_model(store, model_dir, "real")
    assert result.files == 4
    served = read_all(store_dir)
    for rel in ("model.safetensors", "model.gguf", "sub/copy-of-model.safetensors", "tokenizer.json"):
        assert hashlib.sha256(served[f"real/{rel}"]).hexdigest() == sha(model_dir / rel)
    assert lmz(["--store", str(store_dir), "ls", "real", "--json"]) == 0
    files = {f["path"]: f for f in json.loads(capsys.readouterr().out)}
    # Charges go in path order: the original comes first, its copy under sub/ costs nothing.
    assert files["sub/copy-of-model.safetensors"]["stored_bytes"] == 0
    assert files["model.safetensors"]["stored_bytes"] > 0
    assert lmz(["--store", str(store_dir), "ls", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["model"] == "real" and row["files"] == 4
    assert row["stored_bytes"] == sum(f["stored_bytes"] for f in files.values())
    assert row["stored_bytes"] < row["logical_bytes"] - (model_dir / "model.safetensors").stat().st_size


def test_identical_tensors_in_two_models_are_stored_once(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=1)
    add_model(store, a, "one")
    before = pack_bytes(store)
    b = tmp_path / "b"
    b.mkdir()
    (b / "renamed.safetensors").write_bytes((a / "model.safetensors").read_bytes())
    r = add_model(store, b, "two")
    assert r.new_chunks == 0 and r.new_payload_bytes == 0
    assert pack_bytes(store) == before


def test_a_2000_random_preads_equal_the_original(model_dir, store_dir):
    add_model(StorePaths(store_dir), model_dir, "m")
    rng = random.Random(7)
    archive = Archive(store_dir, cache_bytes=8 << 20)
    try:
        for e in archive.files():
            original = (model_dir / e.path).read_bytes()
            with archive.open(e) as r:
                for _ in range(2000 // 4):
                    off = rng.randrange(0, e.size + 10)
                    n = rng.choice([1, 7, 4096, 131072, 1 << 20, 3 << 20])
                    assert r.pread(off, n) == original[off:off + n]
        assert archive.source.cache.size_bytes <= 8 << 20
    finally:
        archive.close()


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "..", "a//b", "x\ny", "a\x00b", ".lmzfs", "./a", "a/"])
def test_bad_model_names_are_refused_before_anything_is_written(tmp_path, store_dir, name):
    src = small_model(tmp_path / "src", mib=1)
    with pytest.raises(StoreError):
        add_model(StorePaths(store_dir), src, name)
    assert not (store_dir / "catalog.sqlite").exists()


def test_family_names_nest_but_a_name_may_not_be_both_a_model_and_a_family(tmp_path, store_dir):
    store = StorePaths(store_dir)
    src = small_model(tmp_path / "src", mib=1)
    add_model(store, src, "run1/step-1000")
    add_model(store, src, "run1/step-2000")
    with pytest.raises(StoreError, match="nest"):
        add_model(store, src, "run1")
    with pytest.raises(StoreError, match="already exists"):
        add_model(store, src, "run1/step-1000")


def test_a_symlink_pointing_outside_the_dir_is_refused_with_a_clear_message(tmp_path, store_dir):
    src = small_model(tmp_path / "src", mib=1)
    (tmp_path / "secret").write_text("outside")
    (src / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(StoreError, match="outside the added directory"):
        add_model(StorePaths(store_dir), src, "m")


def test_a_symlink_inside_the_dir_is_served_as_the_file_it_points_to(tmp_path, store_dir):
    src = small_model(tmp_path / "src", mib=1)
    (src / "alias.json").symlink_to("config.json")
    add_model(StorePaths(store_dir), src, "m")
    assert read_all(store_dir)["m/alias.json"] == (src / "config.json").read_bytes()


def test_rm_then_gc_returns_the_store_to_the_size_of_what_remains(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=1), "a")
    only_a = pack_bytes(store)
    add_model(store, small_model(tmp_path / "b", seed=2), "b")
    assert pack_bytes(store) > only_a
    remove_models(store, ["b"])
    assert model_names(store) == ["a"]
    r = collect_garbage(store)
    assert r.reclaimed > 0
    assert pack_bytes(store) == only_a
    assert verify_store(store).ok
    assert read_all(store_dir)["a/model.safetensors"] == (tmp_path / "a" / "model.safetensors").read_bytes()
    assert collect_garbage(store).reclaimed == 0


def test_rm_of_an_unknown_model_changes_nothing(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a"), "a")
    with pytest.raises(StoreError, match="no model named 'nope'"):
        remove_models(store, ["a", "nope"])
    assert model_names(store) == ["a"]


def test_a_reader_opened_before_rm_and_gc_keeps_reading_until_closed(tmp_path, store_dir):
    store = StorePaths(store_dir)
    src = small_model(tmp_path / "a", seed=3)
    add_model(store, src, "a")
    add_model(store, small_model(tmp_path / "b", seed=4), "b")
    archive = Archive(store_dir, cache_bytes=0)
    try:
        (entry,) = [e for e in archive.files() if e.model == "a" and e.path == "model.safetensors"]
        with archive.open(entry) as reader:
            remove_models(store, ["a"])
            collect_garbage(store)
            assert reader.pread(0, entry.size) == (src / "model.safetensors").read_bytes()
        with pytest.raises(FileNotFoundError):
            archive.open(entry)
    finally:
        archive.close()


def test_a_pack_whose_reserved_header_field_is_not_zero_is_refused_on_read_and_by_verify(tmp_path, store_dir,
                                                                                       capsys):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=7, mib=1), "a")
    (pack,) = store.packs.glob("pack-*.lmzp")
    with open(pack, "r+b") as f:
        f.seek(12)
        f.write((1).to_bytes(4, "little"))          # "LMZPACK\0" | version | reserved
    archive = Archive(store_dir)
    try:
        with pytest.raises(CorruptChunk, match="reserved field is 0x1, not 0"):
            with archive.open(archive.entry("a", "model.safetensors")) as r:
                r.pread(0, 4096)
    finally:
        archive.close()
    assert lmz(["--store", str(store_dir), "verify"]) == 1
    assert "DAMAGED a/model.safetensors" in capsys.readouterr().out


def test_a_flipped_byte_in_a_pack_is_named_by_verify_and_raises_on_read(tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=5)
    b = small_model(tmp_path / "b", seed=6)
    add_model(store, a, "a")
    add_model(store, b, "b")
    bad_offset = flip_byte_in_chunk_of(store, "a", "model.safetensors")
    assert lmz(["--store", str(store_dir), "verify"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED a/model.safetensors" in out
    assert "b/model.safetensors" not in out and "a/config.json" not in out.replace("DAMAGED a/model", "")
    archive = Archive(store_dir)
    try:
        with archive.open(archive.entry("a", "model.safetensors")) as r:
            with pytest.raises(CorruptChunk) as info:
                r.pread(bad_offset, 4096)
            assert info.value.errno == 5
        with archive.open(archive.entry("b", "model.safetensors")) as r:
            assert r.pread(0, r.size) == (b / "model.safetensors").read_bytes()
    finally:
        archive.close()
    assert lmz(["--store", str(store_dir), "verify", "b"]) == 0


def test_a_truncated_pack_is_reported_not_served(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=8), "a")
    (pack,) = store.packs.glob("pack-*.lmzp")
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size - 1000)
    report = verify_store(store)
    assert [d.path for d in report.damaged] == ["model.safetensors"]


def test_a_store_of_an_unknown_version_is_refused(tmp_path, store_dir):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", mib=1), "a")
    store.format_file.write_text("lmzfs-store 99\n")
    with pytest.raises(StoreError, match="version 99 is not supported"):
        Archive(store_dir)
    assert lmz(["--store", str(store_dir), "ls"]) == 2


def test_a_garbage_catalog_is_a_clear_error(tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", mib=1), "a")
    for p in store_dir.glob("catalog.sqlite*"):
        p.write_bytes(b"this is not sqlite" * 100)
    assert lmz(["--store", str(store_dir), "ls"]) == 2
    assert "catalog" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["append:1", "append:7", "session-sealed"])
def test_kill_9_during_add_leaves_nothing_visible_and_the_add_then_succeeds(tmp_path, store_dir, stage):
    store = StorePaths(store_dir)
    keep = small_model(tmp_path / "keep", seed=9, mib=2)
    add_model(store, keep, "keep")
    victim = small_model(tmp_path / "victim", seed=10, mib=28)       # 7 float chunks and more
    kill_at_point(_add_command(store_dir, victim, "victim"), stage)
    assert model_names(store) == ["keep"]
    assert verify_store(store).ok
    add_model(store, victim, "victim")
    assert read_all(store_dir)["victim/model.safetensors"] == (victim / "model.safetensors").read_bytes()
    remove_models(store, ["victim"])
    assert collect_garbage(store).reclaimed > 0
    assert verify_store(store).ok
    assert read_all(store_dir)["keep/model.safetensors"] == (keep / "model.safetensors").read_bytes()
    # Nothing of the killed add or of the removed model is left: the packs hold exactly what "keep" needs.
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, keep, "keep")
    assert pack_bytes(store) == pack_bytes(fresh)


def test_a_second_writer_waits_for_the_first(tmp_path, store_dir):
    from lmzfs.store.lock import WriterLock
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", mib=1), "a")
    with WriterLock(store.lock):
        with pytest.raises(StoreError, match="another lmz process"):
            with WriterLock(store.lock, wait=False):
                pass


def test_cat_writes_the_exact_bytes(tmp_path, store_dir):
    src = small_model(tmp_path / "a", mib=2)
    add_model(StorePaths(store_dir), src, "fam/a")
    out = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store_dir), "cat", "fam/a/model.safetensors"],
                         capture_output=True, check=True).stdout
    assert out == (src / "model.safetensors").read_bytes()
    bad = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store_dir), "cat", "fam/a/nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_lmz_add_fast_and_default_models_share_a_store_and_read_back_exactly(tmp_path, store_dir, capsys):
    a, b = small_model(tmp_path / "a", seed=61, mib=2), small_model(tmp_path / "b", seed=62, mib=2)
    assert lmz(["--store", str(store_dir), "add", "--fast", str(a), "--name", "quick"]) == 0
    assert lmz(["--store", str(store_dir), "add", str(b), "--name", "small"]) == 0
    # content already stored keeps the codec it was stored with: the copy costs nothing new
    assert lmz(["--store", str(store_dir), "add", str(a), "--name", "quick-again"]) == 0
    assert "new data stored 0 B" in capsys.readouterr().out.splitlines()[-1]
    with pytest.raises(SystemExit):
        lmz(["--store", str(store_dir), "add", "--fast", "--smallest", str(a), "--name", "both"])
    capsys.readouterr()
    archive = Archive(store_dir)
    try:
        quick = set(archive.entry("quick", "model.safetensors").codecs.split(","))
        small = set(archive.entry("small", "model.safetensors").codecs.split(","))
    finally:
        archive.close()
    assert quick <= {"raw", "zstd", "bytegroup"} and "floatseg" in small
    files = read_all(store_dir)
    assert files["quick/model.safetensors"] == files["quick-again/model.safetensors"] == \
        (a / "model.safetensors").read_bytes()
    assert files["small/model.safetensors"] == (b / "model.safetensors").read_bytes()


def test_lmz_add_chunk_size_cuts_smaller_chunks_that_read_back_exactly_and_refuses_odd_sizes(tmp_path, store_dir,
                                                                                               capsys):
    src = small_model(tmp_path / "src", seed=63, mib=2)
    assert lmz(["--store", str(store_dir), "add", "--chunk-size", "256K", str(src), "--name", "small"]) == 0
    assert lmz(["--store", str(store_dir), "add", str(src), "--name", "default"]) == 0
    catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
    try:
        sizes = {f.model: [e.size for e in catalog.extents(f.id)]
                 for f in catalog.files() if f.path == "model.safetensors"}
    finally:
        catalog.close()
    total = (src / "model.safetensors").stat().st_size
    assert max(sizes["small"]) == 256 << 10 and sum(sizes["small"]) == total
    assert max(sizes["default"]) == 2 << 20 and sum(sizes["default"]) == total      # the whole 2 MiB tensor
    files = read_all(store_dir)
    assert files["small/model.safetensors"] == files["default/model.safetensors"] == \
        (src / "model.safetensors").read_bytes()
    capsys.readouterr()
    for bad in ("1K", "32M"):
        assert lmz(["--store", str(store_dir), "add", "--chunk-size", bad, str(src), "--name", "odd"]) == 2
        assert "chunk size" in capsys.readouterr().err
    assert lmz(["--store", str(store_dir), "ls"]) == 0
    assert "odd" not in capsys.readouterr().out


@pytest.fixture
def disk(tmpfs) -> Path:
    return tmpfs("12m")


def test_a_full_disk_is_a_clear_error_and_loses_nothing(tmp_path, disk):
    store = StorePaths(disk / "store")
    keep = small_model(tmp_path / "keep", seed=30, mib=2)
    add_model(store, keep, "keep")
    packed = pack_bytes(store)
    big = tmp_path / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(os.urandom(16 << 20))
    with pytest.raises(StoreError, match="disk full|No space left|full"):
        add_model(store, big, "big")
    assert pack_bytes(store) == packed       # the failed add cut what it appended
    assert model_names(store) == ["keep"]
    assert verify_store(store).ok
    assert read_all(store.root)["keep/model.safetensors"] == (keep / "model.safetensors").read_bytes()
    collect_garbage(store)
    assert verify_store(store).ok
    add_model(store, small_model(tmp_path / "after", seed=31, mib=1), "after")
    assert model_names(store) == ["after", "keep"]


def test_a_first_add_that_fills_the_disk_leaves_no_pack_and_the_space_free(tmp_path, disk):
    big = tmp_path / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(os.urandom(16 << 20))
    store = StorePaths(disk / "store")
    free = free_bytes(disk)
    assert lmz(["--store", str(store.root), "add", str(big), "--name", "big"]) == 2
    assert list(store.packs.iterdir()) == []
    assert free_bytes(disk) >= free - (1 << 20)     # the catalog's few pages, no pack bytes
    assert model_names(store) == []
    after = small_model(tmp_path / "after", seed=32, mib=1)
    add_model(store, after, "after")
    assert read_all(store.root)["after/model.safetensors"] == (after / "model.safetensors").read_bytes()


def _add_command(store: Path, source: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "lmzfs", "--store", str(store), "add", str(source), "--name", name]


def test_gc_on_a_full_disk_frees_what_a_killed_first_add_left(tmp_path, disk):
    victim = small_model(tmp_path / "victim", seed=33, mib=4)
    store = StorePaths(disk / "store")
    kill_at_point(_add_command(store.root, victim, "victim"), "session-sealed")
    left = pack_bytes(store)
    assert left > 1 << 20
    fill(disk)
    assert free_bytes(disk) < 1 << 16
    assert collect_garbage(store).reclaimed == left    # no commit needed, none possible
    assert pack_bytes(store) == 0
    assert model_names(store) == []
    assert verify_store(store).ok


def test_a_gc_without_room_for_its_copies_leaves_the_packs_as_they_were(tmp_path, disk):
    old = small_model(tmp_path / "old", seed=34, mib=2)
    new = small_model(tmp_path / "new", seed=36, mib=3)
    store = StorePaths(disk / "store")
    add_model(store, old, "old")
    add_model(store, new, "new")
    remove_models(store, ["old"])       # dead records ahead of live ones: gc must copy
    packs = {p.name: p.read_bytes() for p in store.packs.iterdir()}
    (disk / "filler").write_bytes(bytes(free_bytes(disk) - (1 << 20)))
    with pytest.raises(StoreError, match="disk full|No space left|full"):
        collect_garbage(store)
    assert {p.name: p.read_bytes() for p in store.packs.iterdir()} == packs
    assert model_names(store) == ["new"]
    assert verify_store(store).ok
    (disk / "filler").unlink()
    assert collect_garbage(store).reclaimed > 0
    assert read_all(store.root)["new/model.safetensors"] == (new / "model.safetensors").read_bytes()


def test_a_store_whose_path_holds_uri_characters_is_added_read_verified_and_repaired(tmp_path, capsys):
    store_dir = tmp_path / "models#2 ?v=1 100%41"     # SQLite reads ?, # and %XX in a file: URI
    store = StorePaths(store_dir)
    src = small_model(tmp_path / "a", seed=63, mib=1)
    assert lmz(["--store", str(store_dir), "add", str(src), "--name", "a"]) == 0
    capsys.readouterr()
    assert lmz(["--store", str(store_dir), "ls"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "a"
    assert read_all(store_dir)["a/model.safetensors"] == (src / "model.safetensors").read_bytes()
    assert lmz(["--store", str(store_dir), "verify", "--repair"]) == 0
    assert f"catalog {store.catalog}: sound" in capsys.readouterr().out
    store.catalog.unlink()                  # repair reads the copies through the same URIs
    assert lmz(["--store", str(store_dir), "verify", "--repair"]) == 0
    assert model_names(store) == ["a"]
    # nothing beside the store: a cut-off URI had put the catalog at tmp_path/models
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", store_dir.name]


def test_an_add_larger_than_a_pack_spans_several_packs_and_reads_back(tmp_path, store_dir, monkeypatch):
    from lmzfs.store import packbackend
    monkeypatch.setattr(packbackend, "MAX_PACK_BYTES", 1 << 20)    # a real model crosses 1 GiB packs so
    store = StorePaths(store_dir)
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(random.Random(60).randbytes(5 << 20))
    add_model(store, src, "big")
    assert len(list(store.packs.glob("pack-*.lmzp"))) >= 4
    assert read_all(store_dir)["big/weights.bin"] == (src / "weights.bin").read_bytes()
    assert verify_store(store).ok
    remove_models(store, ["big"])
    collect_garbage(store)
    assert pack_bytes(store) == 0


def test_a_failed_add_spanning_several_packs_leaves_the_packs_as_they_were(tmp_path, store_dir, monkeypatch):
    from lmzfs.store import packbackend
    monkeypatch.setattr(packbackend, "MAX_PACK_BYTES", 1 << 20)
    store = StorePaths(store_dir)
    keep = small_model(tmp_path / "keep", seed=61, mib=1)
    add_model(store, keep, "keep")
    before = {p.name: p.read_bytes() for p in store.packs.iterdir()}
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(random.Random(62).randbytes(5 << 20))
    (src / "b.bin").write_bytes(b"b" * 1000)

    def progress(done: int, total: int) -> None:
        if done >= 5 << 20:                         # a.bin is in the packs: b.bin changes now
            with open(src / "b.bin", "ab") as f:
                f.write(b"more")

    with pytest.raises(StoreError, match="changed while being added"):
        add_model(store, src, "big", progress=progress)
    assert {p.name: p.read_bytes() for p in store.packs.iterdir()} == before
    assert model_names(store) == ["keep"]
    assert verify_store(store).ok


WRITER_KILLED_AFTER_A_COMMIT = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("INSERT OR REPLACE INTO meta VALUES ('copy_test_note', 'left in the log')")      # copy_* keys: outside the digest
os._exit(0)         # no close: the commit stays in catalog.sqlite-wal, not yet copied into the file
"""


def test_a_read_only_store_with_commits_left_in_its_log_says_how_to_open_it(tmp_path, tmpfs):
    disk = tmpfs("12m")
    store = StorePaths(disk / "store")
    add_model(store, small_model(tmp_path / "a", seed=51, mib=1), "a")
    subprocess.run([sys.executable, "-c", WRITER_KILLED_AFTER_A_COMMIT, str(store.catalog)], check=True)
    assert (disk / "store" / "catalog.sqlite-wal").stat().st_size > 0
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    assert model_names(store) == ["a"]          # SQLite reads the log through the -shm left with it
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    (disk / "store" / "catalog.sqlite-shm").unlink()      # as a copy of the store without it would be
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    out = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store.root), "ls"], capture_output=True,
                         text=True)
    assert (out.returncode, out.stderr) == (2, f"lmz: catalog {store.catalog} cannot be used: unable to open "
                                               f"database file; the file system holding it is read-only, and "
                                               f"catalog.sqlite-wal beside it holds commits not yet in the file: "
                                               f"open the store once where it is writable\n")
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert model_names(store) == ["a"]          # SQLite applies the log once it may
    assert verify_store(store).ok


def test_a_writer_cuts_nothing_the_catalog_names(tmp_path, store_dir):
    from lmzfs.store.packbackend import LocalPacks
    from lmzfs.store.write.session import PackSession
    store = StorePaths(store_dir)
    add_model(store, small_model(tmp_path / "a", seed=35, mib=1), "a")
    before = pack_bytes(store)
    catalog = Catalog(store.catalog)
    try:
        writer = LocalPacks(store).appender(*catalog.pack_ids())
        writer.append(b"\x01" * 32, b"payload")
        writer.seal()
        # as if its commit had gone through: the catalog names a record past where it began
        assert writer.discard(lambda pack: before + 1) is False
        assert pack_bytes(store) == before + 40 + len(b"payload")
        with pytest.raises(KeyboardInterrupt):
            with PackSession(store, catalog) as session:
                session.append(b"\x02" * 32, b"more")
                raise KeyboardInterrupt         # before its commit: back to where it began
        assert pack_bytes(store) == before + 40 + len(b"payload")
    finally:
        catalog.close()


def test_removing_the_older_of_two_models_rewrites_the_pack_and_keeps_the_newer_readable(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=40)
    b = small_model(tmp_path / "b", seed=41)
    add_model(store, a, "a")
    add_model(store, b, "b")
    remove_models(store, ["a"])
    r = collect_garbage(store)
    assert r.packs_rewritten == 1 and r.packs_deleted == 1 and r.reclaimed > 0
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, b, "b")
    assert pack_bytes(store) == pack_bytes(fresh)
    assert read_all(store_dir)["b/model.safetensors"] == (b / "model.safetensors").read_bytes()
    assert verify_store(store).ok
    add_model(store, a, "a-again")       # appends to the rewritten pack
    assert read_all(store_dir)["a-again/model.safetensors"] == (a / "model.safetensors").read_bytes()


def test_a_default_add_uses_the_entropy_coded_codecs_and_fast_keeps_to_the_quick_ones(tmp_path, store_dir, capsys):
    src = small_model(tmp_path / "src", seed=50, mib=2)
    store = StorePaths(store_dir)
    add_model(store, src, "fast", fast=True)
    add_model(StorePaths(tmp_path / "max"), src, "max", segments=False)
    assert lmz(["--store", str(tmp_path / "seg"), "add", str(src), "--name", "seg"]) == 0

    def codecs(root: Path) -> set[str]:
        archive = Archive(root)
        try:
            return set(archive.entry(archive.files()[0].model, "model.safetensors").codecs.split(","))
        finally:
            archive.close()

    assert codecs(store_dir) <= {"raw", "zstd", "bytegroup"}
    assert "floatsplit" in codecs(tmp_path / "max") and "floatseg" not in codecs(tmp_path / "max")
    assert "floatseg" in codecs(tmp_path / "seg")
    assert read_all(tmp_path / "seg")["seg/model.safetensors"] == (src / "model.safetensors").read_bytes()
    assert read_all(store_dir)["fast/model.safetensors"] == (src / "model.safetensors").read_bytes()
    assert read_all(tmp_path / "max")["max/model.safetensors"] == (src / "model.safetensors").read_bytes()


@pytest.mark.parametrize("reading", [False, True])
def test_gc_cuts_a_dead_pack_tail_in_place_unless_a_reader_has_the_packs_open(tmp_path, reading):
    store = StorePaths(tmp_path / "store")
    a, b = small_model(tmp_path / "a", seed=41), small_model(tmp_path / "b", seed=42)
    add_model(store, a, "a")
    add_model(store, b, "b")           # appended after a's chunks, in the same pack
    (pack,) = store.packs.glob("pack-*.lmzp")
    inode = pack.stat().st_ino
    remove_models(store, ["b"])
    archive = Archive(store.root, workers=0) if reading else None
    try:
        result = collect_garbage(store)
    finally:
        if archive is not None:
            archive.close()
    assert result.reclaimed > 0
    assert (result.packs_truncated, result.packs_rewritten) == ((0, 1) if reading else (1, 0))
    (after,) = store.packs.glob("pack-*.lmzp")
    assert (after.stat().st_ino == inode) == (not reading)     # a reader's descriptor keeps the old file whole
    check = Archive(store.root, workers=0)
    try:
        with check.open(check.entry("a", "model.safetensors")) as r:
            assert r.pread(0, r.size) == (a / "model.safetensors").read_bytes()
    finally:
        check.close()
