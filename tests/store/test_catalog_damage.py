"""The catalog survives damage: a zeroed page, a flipped bit, a deleted or truncated file, a
writer killed while copying it. Every command says so in one line, and `lmz verify --repair`
brings every model committed before the damage back byte for byte."""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from lmzfs.daemon.mount import MountError
from lmzfs.daemon.mount import check_store as check_store_for_mount
from lmzfs.doctor import check_store as doctor_check_store
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog, CatalogDamaged
from lmzfs.store.catalog.check import diagnose, examine
from lmzfs.store.catalog.copies import KEEP_COPIES, due_marker, generation_of, list_copies, write_copy
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.admin.verify import verify_store
from lmzfs.testing.catalogdamage import (PAGE, Damage, damage_file, file_digests, print_failures, random_damages,
                                         run_lmz, run_trial, summary_line)
from lmzfs.testing.checkpoints import bf16_checkpoints
from lmzfs.testing.killpoints import kill_at_marker
from lmzfs.testing.smalldisk import fill
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model

COMMANDS = [["ls"], ["ls", "--json"], ["ls", "m1"], ["cat", "m0/model.safetensors"], ["verify"], ["gc"]]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A store of three small models, and the SHA-256 of each of its files."""
    work = tmp_path_factory.mktemp("prepared")
    store = StorePaths(work / "store")
    for i in range(3):
        add_model(store, small_model(work / f"m{i}", seed=i, mib=2), f"m{i}")
    return store.root, file_digests(store.root)


def assert_all_recovered(results) -> None:
    failures = [r for r in results if not r.ok]
    if failures:
        print_failures(failures)
    assert not failures, summary_line(results)


def test_zeroing_each_page_of_the_catalog_in_turn_then_repairing_reads_every_file_back(prepared, tmp_path):
    root, expected = prepared
    pages = (root / "catalog.sqlite").stat().st_size // PAGE
    assert pages >= 8
    results = [run_trial(root, tmp_path / "trial", Damage("zero-page", p * PAGE), expected, commands=COMMANDS)
               for p in range(pages)]
    assert_all_recovered(results)


def test_flipped_bits_and_unaligned_zeroed_runs_are_repaired_too(prepared, tmp_path):
    root, expected = prepared
    size = (root / "catalog.sqlite").stat().st_size
    damages = random_damages(size, 20, random.Random(28))
    assert {d.kind for d in damages} == {"zero-page", "flip-bit"} and any(d.at % PAGE for d in damages)
    results = [run_trial(root, tmp_path / "trial", d, expected, commands=COMMANDS[:2] + COMMANDS[3:5])
               for d in damages]
    assert_all_recovered(results)


def store_of_two(tmp_path: Path) -> StorePaths:
    store = StorePaths(tmp_path / "store")
    add_model(store, small_model(tmp_path / "a", seed=1, mib=2), "a")
    add_model(store, small_model(tmp_path / "b", seed=2, mib=2), "b")
    return store


def repair(store: StorePaths):
    return run_lmz(["--store", str(store.root), "verify", "--repair"])


def test_every_command_names_a_deleted_catalog_in_one_line_and_repair_restores_it(tmp_path, capsys):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    store.catalog.unlink()
    for argv in (["ls"], ["cat", "a/model.safetensors"], ["verify"], ["add", str(tmp_path / "a"), "--name", "c"],
                 ["rm", "a"], ["gc"]):
        out = run_lmz(["--store", str(store.root), *argv])
        assert out.traceback is None and out.rc != 0
        assert out.stderr == (f"lmz: catalog {store.catalog} is damaged: run lmz verify --repair "
                              "(it is missing)\n")
    assert repair(store).rc == 0
    assert file_digests(store.root) == before
    assert not list(store.root.glob("catalog.sqlite.damaged-*"))        # nothing was there to keep


@pytest.mark.parametrize("keep", [0, 100, PAGE + 7])
def test_a_truncated_catalog_is_kept_aside_and_its_copy_restored(tmp_path, keep):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    original = store.catalog.read_bytes()
    os.truncate(store.catalog, keep)
    for argv in (["ls"], ["add", str(tmp_path / "a"), "--name", "c"], ["gc"]):
        out = run_lmz(["--store", str(store.root), *argv])
        assert out.rc == 2 and out.traceback is None
        assert out.stderr.startswith(f"lmz: catalog {store.catalog} is damaged: run lmz verify --repair (")
        assert len(out.stderr.splitlines()) == 1
    assert repair(store).rc == 0
    assert file_digests(store.root) == before
    [kept] = store.root.glob("catalog.sqlite.damaged-*")
    assert kept.read_bytes() == original[:keep]


def test_repair_is_idempotent_and_a_second_run_changes_nothing(tmp_path, capsys):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    damage_file(store.catalog, Damage("zero-page", 2 * PAGE))
    first = run_lmz(["--store", str(store.root), "verify", "--repair"])
    assert first.rc == 0
    catalog_after_first = store.catalog.read_bytes()
    copies_after_first = [c.path.name for c in list_copies(store.catalog)]
    second = run_lmz(["--store", str(store.root), "verify", "--repair"])
    assert second.rc == 0
    assert store.catalog.read_bytes() == catalog_after_first
    assert [c.path.name for c in list_copies(store.catalog)] == copies_after_first
    assert len(list(store.root.glob("catalog.sqlite.damaged-*"))) == 1
    assert file_digests(store.root) == before


def test_repair_prints_what_it_found_and_did(tmp_path, capsys):
    store = store_of_two(tmp_path)
    damage_file(store.catalog, Damage("zero-page", 0))
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    [kept] = store.root.glob("catalog.sqlite.damaged-*")
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"catalog {store.catalog} was damaged: file is not a database",
                         f"  kept the damaged file as {kept}",
                         "  restored catalog.sqlite.copy-0000000002"]
    assert lines[3].startswith("verify: 4 file(s), ") and lines[3].endswith(": ok")
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"catalog {store.catalog}: sound"


def _commit_left_without_its_copy(store: StorePaths) -> None:
    """What a writer killed between committing b and writing b's copy leaves, then a damaged catalog."""
    list_copies(store.catalog)[0].path.unlink()
    due_marker(store.catalog).touch()
    damage_file(store.catalog, Damage("flip-bit", store.catalog.stat().st_size - 100, 3))


def test_a_model_committed_after_the_newest_copy_is_recovered_from_the_damaged_catalogs_rows(tmp_path, capsys):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    _commit_left_without_its_copy(store)
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    out = capsys.readouterr().out
    assert "  recovered b from the rows the damaged catalog still holds (every file checked against its SHA-256)\n" in out
    assert "LOST" not in out
    assert file_digests(store.root) == before
    assert not due_marker(store.catalog).exists() and diagnose(store).sound


def test_a_repair_salvages_in_the_store_not_in_tmp_and_removes_a_scratch_a_killed_repair_left(
        tmp_path, capsys, monkeypatch):
    import tempfile
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    _commit_left_without_its_copy(store)
    left = store.root / ".salvage-killed"
    left.mkdir()
    (left / "catalog.sqlite").write_bytes(b"a copy a killed repair was reading")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    assert "  recovered b from the rows the damaged catalog still holds" in capsys.readouterr().out
    assert file_digests(store.root) == before
    assert list(store.root.glob(".salvage-*")) == []


def test_a_model_only_the_damaged_catalog_names_whose_chunks_do_not_decode_is_named_as_lost(tmp_path, capsys):
    store = store_of_two(tmp_path)
    of_a = {k: v for k, v in file_digests(store.root).items() if k.startswith("a/")}
    flip_byte_in_chunk_of(store, "b", "model.safetensors")
    _commit_left_without_its_copy(store)
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 1
    out = capsys.readouterr().out
    assert "LOST b: not in the restored copy, or its chunks are in no pack\n" in out
    assert "recovered" not in out
    assert file_digests(store.root) == of_a
    assert not due_marker(store.catalog).exists() and diagnose(store).sound


def test_a_flipped_model_name_is_restored_not_reported_as_a_lost_model(tmp_path):
    store = StorePaths(tmp_path / "store")
    add_model(store, small_model(tmp_path / "a", seed=1, mib=1), "model-alpha")
    before = file_digests(store.root)
    data = store.catalog.read_bytes()
    assert data.count(b"model-alpha") >= 1
    damage_file(store.catalog, Damage("flip-bit", data.index(b"model-alpha") + 6, 1))    # "model-clpha"
    out = repair(store)
    assert out.rc == 0 and out.traceback is None
    assert file_digests(store.root) == before


def test_an_older_copy_from_before_a_gc_finds_the_records_the_gc_moved(tmp_path):
    store = store_of_two(tmp_path)
    remove_models(store, ["a"])
    before = file_digests(store.root)
    assert collect_garbage(store).packs_rewritten == 1
    newest = list_copies(store.catalog)[0]
    damage_file(newest.path, Damage("flip-bit", newest.path.stat().st_size - 200, 0))   # the gc's own copy
    damage_file(store.catalog, Damage("zero-page", PAGE))
    from lmzfs.store.catalog.repair import repair_catalog
    report = repair_catalog(store)
    assert report.restored_from == store.catalog.with_name("catalog.sqlite.copy-0000000003")
    assert report.relocated_chunks > 0 and report.recovered
    assert file_digests(store.root) == before
    assert diagnose(store).sound


def test_a_copy_of_a_version_1_catalog_is_restored_and_upgraded(tmp_path):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    for c in list_copies(store.catalog):
        c.path.unlink()
    db = sqlite3.connect(store.catalog, isolation_level=None)
    for statement in ("DROP INDEX chunks_by_base", "ALTER TABLE chunks DROP COLUMN base", "DROP TABLE tensors",
                      "ALTER TABLE chunks DROP COLUMN xxh3"):
        db.execute(statement)
    db.execute("UPDATE meta SET value = '1' WHERE key = 'catalog_version'")
    write_copy(db, store.catalog)           # a copy as an lmzfs of catalog version 1 would write it
    db.close()
    assert examine(list_copies(store.catalog)[0].path, copy=True).clean
    damage_file(store.catalog, Damage("zero-page", 3 * PAGE))
    assert repair(store).rc == 0
    catalog = Catalog(store.catalog, readonly=True)
    try:
        assert catalog.version == "3"
    finally:
        catalog.close()
    assert file_digests(store.root) == before


def test_a_copy_of_an_unknown_newer_version_is_not_restored(tmp_path):
    store = store_of_two(tmp_path)
    for c in list_copies(store.catalog):
        db = sqlite3.connect(c.path)
        db.execute("UPDATE meta SET value = '9' WHERE key = 'catalog_version'")
        db.commit()
        db.close()
    damage_file(store.catalog, Damage("zero-page", 0))
    out = repair(store)
    assert out.rc == 2 and out.traceback is None
    assert out.stderr.startswith(f"lmz: catalog {store.catalog} is damaged (file is not a database) and no copy "
                                 "of it checks clean (2 found); it is left as it is")
    assert not list(store.root.glob("catalog.sqlite.damaged-*"))


_COPY_LOOP = """
import sqlite3, sys
from pathlib import Path
from lmzfs.store.catalog.copies import write_copy
catalog = Path(sys.argv[1])
db = sqlite3.connect(catalog, isolation_level=None)
print("ready", flush=True)
while True:
    write_copy(db, catalog)
"""


def test_kill_9_while_a_copy_is_written_leaves_the_store_consistent(tmp_path):
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    rng = random.Random(9)
    for _ in range(12):
        kill_at_marker([sys.executable, "-c", _COPY_LOOP, str(store.catalog)], "ready", delay=rng.uniform(0, 0.05))
        copies = list_copies(store.catalog)
        assert 1 <= len(copies) <= KEEP_COPIES + 1
        assert all(examine(c.path, copy=True).clean for c in copies)
        assert diagnose(store).sound
    assert repair(store).rc == 0
    add_model(store, small_model(tmp_path / "c", seed=3, mib=1), "c")
    assert not store.catalog.with_name("catalog.sqlite.copy-tmp").exists()
    assert {k: v for k, v in file_digests(store.root).items() if not k.startswith("c/")} == before


def test_kill_9_of_a_repair_at_any_moment_leaves_a_store_the_next_repair_brings_back(tmp_path):
    # found by make torture: a repair killed just after renaming the restored copy into place
    # left a hot rollback journal beside the catalog, and every command then stopped
    import time
    from lmzfs.testing.torture.common import fork_writer_and_kill
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    damage_file(store.catalog, Damage("zero-page", 2 * PAGE))
    damaged = tmp_path / "damaged"
    shutil.copytree(store.root, damaged)
    trial = tmp_path / "trial"
    started = time.monotonic()
    assert run_lmz(["--store", str(shutil.copytree(damaged, trial)), "verify", "--repair"]).rc == 0
    took = time.monotonic() - started
    for i in range(40):
        shutil.rmtree(trial)
        shutil.copytree(damaged, trial)
        fork_writer_and_kill(trial, ["verify", "--repair"], point=None, delay=took * i / 40,
                             stderr_path=tmp_path / "repair.err")
        assert not (trial / "catalog.sqlite-journal").exists(), f"a hot journal after a kill at {i}/40"
        again = run_lmz(["--store", str(trial), "verify", "--repair"])
        assert again.rc == 0 and again.traceback is None, f"killed at {i}/40: {again}"
        assert file_digests(trial) == before
        assert list(trial.glob(".salvage-*")) == [], f"a killed repair's scratch outlived the next at {i}/40"


def test_a_text_value_flipped_into_bytes_that_are_not_utf8_is_damage_that_repair_mends(tmp_path):
    # found by make torture: 'safetensors' with one bit flipped was "cannot be used", not damage
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    data = bytearray(store.catalog.read_bytes())
    at = data.find(b"safetensors")
    while at >= 0:                        # wherever a row (or an index) holds it
        data[at + 7] ^= 0x80              # 's' becomes 0xf3: a lead byte with no continuation
        at = data.find(b"safetensors", at + 1)
    store.catalog.write_bytes(bytes(data))
    first = run_lmz(["--store", str(store.root), "verify"])
    assert first.rc == 2 and "is damaged: run lmz verify --repair" in first.stderr, first.stderr
    assert repair(store).rc == 0
    assert file_digests(store.root) == before
    assert verify_store(store).ok


def _schema_text_not_utf8(path: Path) -> None:
    """Flip the top bit of a letter of the schema's text (sqlite_master, page 1): SQLite then
    quotes bytes that are not UTF-8 in its error message."""
    data = bytearray(path.read_bytes())
    at = data.find(b"CREATE TABLE chunks")
    assert 0 <= at < PAGE
    data[at + len("CR")] ^= 0x80              # "CR\xc5ATE": a syntax error SQLite quotes
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["catalog", "newest copy"])
def test_schema_text_flipped_into_bytes_that_are_not_utf8_is_damage_not_a_traceback(tmp_path, where):
    # found by make torture (6 Dec): Python's sqlite3 raised UnicodeDecodeError, not a database error
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    _schema_text_not_utf8(store.catalog if where == "catalog" else list_copies(store.catalog)[-1].path)
    if where == "catalog":
        for argv in (["ls"], ["cat", "a/model.safetensors"], ["verify"]):
            ran = run_lmz(["--store", str(store.root), *argv])
            assert ran.rc == 2 and "is damaged: run lmz verify --repair" in ran.stderr, (argv, ran.stderr)
            assert "Traceback" not in ran.stderr
    fixed = repair(store)
    assert fixed.rc == 0 and "Traceback" not in fixed.stderr, fixed.stderr
    assert file_digests(store.root) == before
    assert verify_store(store).ok


@pytest.mark.parametrize("where", ["catalog", "newest copy"])
@pytest.mark.parametrize("byte", [18, 19, 21])
def test_a_header_field_sqlite_opens_without_complaint_is_damage_that_repair_mends(tmp_path, where, byte):
    # found by make torture (6 Dec): bit 2 of byte 18 (the file format write version) flipped made
    # SQLite open the catalog read-only; verify --repair passed it and the next gc failed to write
    store = store_of_two(tmp_path)
    before = file_digests(store.root)
    path = store.catalog if where == "catalog" else list_copies(store.catalog)[0].path
    data = bytearray(path.read_bytes())
    data[byte] ^= 0x04
    path.write_bytes(bytes(data))
    assert f"(byte {byte}) reads {data[byte]}" in examine(path, copy=where != "catalog").problem
    if where == "catalog":
        ran = run_lmz(["--store", str(store.root), "verify"])
        assert ran.rc == 2 and "is damaged: run lmz verify --repair" in ran.stderr, ran.stderr
    fixed = repair(store)
    assert fixed.rc == 0 and "Traceback" not in fixed.stderr, fixed.stderr
    remove_models(store, ["a"])
    collect_garbage(store)                    # writes: the catalog in place is writable again
    assert {k: v for k, v in file_digests(store.root).items() if not k.startswith("a/")} == \
        {k: v for k, v in before.items() if not k.startswith("a/")}
    assert verify_store(store).ok
    assert all(examine(c.path, copy=True).clean for c in list_copies(store.catalog))


def test_add_into_a_catalog_whose_header_sqlite_opened_read_only_says_it_is_damaged(tmp_path):
    store = store_of_two(tmp_path)
    data = bytearray(store.catalog.read_bytes())
    data[18] ^= 0x04                          # write version 6: SQLite opens the file read-only
    store.catalog.write_bytes(bytes(data))
    model = small_model(tmp_path / "c", seed=3)
    ran = run_lmz(["--store", str(store.root), "add", str(model)])
    assert ran.rc == 2 and "is damaged" in ran.stderr and "(byte 18) reads 6" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and "readonly" not in ran.stderr


def test_the_copy_a_repair_renames_into_place_is_already_in_wal_mode(tmp_path):
    # switched afterwards, the switch writes through a rollback journal that a kill leaves hot
    # beside the catalog, where no read-only open can roll it back (found by make torture)
    from lmzfs.store.catalog.repair import _stage
    store = store_of_two(tmp_path)
    (copy, *_) = list_copies(store.catalog)
    staged = _stage(copy.path, store)
    db = sqlite3.connect(f"file:{staged}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()
    assert not staged.with_name(staged.name + "-journal").exists()


def test_each_commit_leaves_a_copy_and_only_the_newest_three_are_kept(tmp_path):
    store = store_of_two(tmp_path)
    assert [c.generation for c in list_copies(store.catalog)] == [2, 1]
    remove_models(store, ["a"])
    collect_garbage(store)
    assert [c.generation for c in list_copies(store.catalog)] == [4, 3, 2]
    assert all(examine(c.path, copy=True).clean for c in list_copies(store.catalog))
    assert not due_marker(store.catalog).exists()


def test_a_writer_refuses_a_catalog_whose_content_differs_from_its_copy(tmp_path):
    store = store_of_two(tmp_path)
    db = sqlite3.connect(store.catalog)
    db.execute("UPDATE files SET size = size + 1 WHERE path = 'model.safetensors'")    # what no integrity check sees
    db.commit()
    db.close()
    with pytest.raises(CatalogDamaged, match="its content differs from its copy catalog.sqlite.copy-0000000002"):
        add_model(store, small_model(tmp_path / "c", seed=3, mib=1), "c")
    assert repair(store).rc == 0
    add_model(store, small_model(tmp_path / "c", seed=3, mib=1), "c")


def test_doctor_and_mount_point_at_repair_in_one_line(tmp_path):
    store = store_of_two(tmp_path)
    damage_file(store.catalog, Damage("zero-page", 0))
    problems: list[str] = []
    doctor_check_store(store, problems)
    assert problems == [f"catalog {store.catalog} is damaged: run lmz verify --repair (file is not a database)"]
    with pytest.raises(MountError) as err:
        check_store_for_mount(store.root)
    assert str(err.value) == f"catalog {store.catalog} is damaged: run lmz verify --repair (file is not a database)"


# -- chains: a copy older than a recode, and references recounted -----------------------------------

def chain_of(tmp_path: Path, n: int, **add) -> tuple[StorePaths, list[str], dict[str, str]]:
    """A store of n BF16 checkpoints added one at a time (each add recodes its predecessor as
    deltas unless told otherwise), their names, and the SHA-256 of every source file."""
    store = StorePaths(tmp_path / "store")
    dirs = bf16_checkpoints(tmp_path / "src", n)
    names = [f"run1/step-{k}" for k in range(n)]
    for d, name in zip(dirs, names):
        add_model(store, d, name, **add)
    want = {f"{name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for d, name in zip(dirs, names) for p in sorted(d.iterdir())}
    return store, names, want


def bases_of(store: StorePaths, model: str) -> dict[bytes, bytes | None]:
    """Each chunk of MODEL's files -> the chunk it is coded against (None: coded alone)."""
    db = sqlite3.connect(f"file:{store.catalog}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT DISTINCT c.id, c.base FROM chunks c JOIN extents e ON e.chunk = c.id "
                               "JOIN files f ON f.id = e.file JOIN models m ON m.id = f.model WHERE m.name = ?",
                               (model,)))
    finally:
        db.close()


def generation(store: StorePaths) -> int:
    db = sqlite3.connect(store.catalog)
    try:
        return generation_of(db)
    finally:
        db.close()


def drop_copies_after(store: StorePaths, g: int) -> None:
    """What a disk that lost the newer copies with the catalog leaves: only copies up to generation g."""
    for c in list_copies(store.catalog):
        if c.generation > g:
            c.path.unlink()
    assert list_copies(store.catalog)[0].generation == g


def test_repair_from_a_copy_older_than_a_rewrite_finds_each_chunks_newer_payload(tmp_path, capsys):
    store, names, want = chain_of(tmp_path, 2)
    assert set(bases_of(store, names[0]).values()) - {None}       # the add recoded step-0 against step-1
    before_rewrite = generation(store)
    for argv in (["anchor", names[0]], ["compact", "--all"]):     # alone again; the delta payloads dropped
        assert run_lmz(["--store", str(store.root), "rewrite", *argv]).rc == 0
    drop_copies_after(store, before_rewrite)
    os.truncate(store.catalog, 0)
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    out = capsys.readouterr().out
    assert "LOST" not in out and f"restored catalog.sqlite.copy-{before_rewrite:010d}" in out
    assert set(bases_of(store, names[0]).values()) == {None}      # the payloads the anchor wrote
    assert verify_store(store).ok
    assert file_digests(store.root) == want
    assert run_lmz(["--store", str(store.root), "gc"]).rc == 0
    assert verify_store(store).ok and file_digests(store.root) == want


def test_repair_takes_a_reference_the_damaged_catalog_still_names_when_the_copy_predates_it(tmp_path, capsys):
    store, names, want = chain_of(tmp_path, 2, delta=False)
    assert set(bases_of(store, names[0]).values()) == {None}
    before_rewrite = generation(store)
    for argv in (["delta", names[0], "--base", names[1]], ["compact", "--all"]):
        assert run_lmz(["--store", str(store.root), "rewrite", *argv]).rc == 0
    chained = bases_of(store, names[0])
    assert set(chained.values()) - {None}
    drop_copies_after(store, before_rewrite)
    db = sqlite3.connect(store.catalog)
    db.execute("UPDATE files SET size = size + 1 WHERE path = 'config.json'")   # unsound, its chunks still read
    db.commit()
    db.close()
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 0
    assert "LOST" not in capsys.readouterr().out
    assert bases_of(store, names[0]) == chained         # only the damaged catalog named those references
    assert verify_store(store).ok and file_digests(store.root) == want


def test_repair_brings_back_a_reference_made_after_the_copy_so_older_members_still_read(tmp_path, capsys):
    store, names, want = chain_of(tmp_path, 2)
    before_step2 = generation(store)
    src = bf16_checkpoints(tmp_path / "src3", 3)[2]     # the same run's next step
    add_model(store, src, "run1/step-2")                # recodes step-1 against it, drops step-1's old payloads
    drop_copies_after(store, before_step2)
    due_marker(store.catalog).touch()                   # commits newer than the newest copy
    db = sqlite3.connect(store.catalog)
    db.execute("UPDATE files SET size = size + 1 WHERE path = 'config.json'")   # unsound, its chunks still read
    db.commit()
    db.close()
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 1
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("LOST")] == [
        "LOST run1/step-2: not in the restored copy, or its chunks are in no pack"]
    # step-1's chunks are deltas against step-2's, which the copy never held: kept as references
    assert set(bases_of(store, names[1]).values()) - {None} <= set(chunk_refs(store))
    assert verify_store(store).ok and file_digests(store.root) == want
    assert run_lmz(["--store", str(store.root), "gc"]).rc == 0
    assert verify_store(store).ok and file_digests(store.root) == want


def chunk_refs(store: StorePaths) -> dict[bytes, int]:
    db = sqlite3.connect(f"file:{store.catalog}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT id, refs FROM chunks"))
    finally:
        db.close()


def test_after_a_repair_gc_keeps_the_chunks_that_are_only_references(tmp_path):
    store, names, want = chain_of(tmp_path, 3)
    remove_models(store, [names[1]])        # its chunks stay: step-0's deltas are coded against them
    kept = {k: v for k, v in want.items() if not k.startswith(names[1] + "/")}
    assert file_digests(store.root) == kept
    refs_before = chunk_refs(store)
    assert any(n == 1 for n in refs_before.values())
    os.truncate(store.catalog, 0)
    assert repair(store).rc == 0
    assert chunk_refs(store) == refs_before         # extents and dependants, as add and rm kept them
    assert run_lmz(["--store", str(store.root), "gc"]).rc == 0
    assert verify_store(store).ok
    assert file_digests(store.root) == kept


# -- a full disk is not damage --------------------------------------------------------------------

@pytest.fixture
def full_disk_store(tmp_path, tmpfs):
    """A store of two models on a 16 MiB tmpfs, then a file that fills the disk to the last block.
    Yields (store, the filler)."""
    disk = tmpfs("16m")
    store = StorePaths(disk / "store")
    for name, seed in (("a", 1), ("b", 2)):
        add_model(store, small_model(tmp_path / name, seed=seed, mib=1), name)
    return store, fill(disk)


def store_files(store: StorePaths) -> dict[str, str]:
    """Every file of the store directory but SQLite's -shm and -wal -> the SHA-256 of its bytes."""
    return {str(p.relative_to(store.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.root.rglob("*")) if p.is_file() and not p.name.endswith(("-shm", "-wal"))}


def test_on_a_full_disk_every_command_says_so_and_repair_moves_nothing(full_disk_store):
    store, filler = full_disk_store
    before = store_files(store)
    said = (f"lmz: catalog {store.catalog} cannot be used: disk I/O error; the disk holding it is full "
            f"(0 bytes free), and SQLite needs room beside the catalog for its -shm and -wal files: free some "
            f"space on that disk and try again")
    for argv in (["ls"], ["rm", "a"], ["gc"]):
        out = run_lmz(["--store", str(store.root), *argv])
        assert (out.traceback, out.rc, out.stderr) == (None, 2, said + "\n")
    out = repair(store)         # a sound catalog that cannot be opened now is not set aside
    assert (out.traceback, out.rc, out.stderr) == (None, 2, said + "; it is not judged damaged\n")
    with pytest.raises(MountError) as err:
        check_store_for_mount(store.root)
    assert str(err.value) == said[len("lmz: "):] + "; it is not judged damaged"
    problems: list[str] = []
    doctor_check_store(store, problems)
    assert problems == [said[len("lmz: "):] + "; it is not judged damaged"]
    assert store_files(store) == before
    filler.unlink()
    assert verify_store(store).ok
    assert run_lmz(["--store", str(store.root), "ls"]).rc == 0


def test_a_repair_with_no_room_for_the_copy_changes_nothing(full_disk_store):
    store, filler = full_disk_store
    damage_file(store.catalog, Damage("zero-page", 0))      # damage that needs no -shm to be seen
    before = store_files(store)
    copy = list_copies(store.catalog)[0].path
    out = repair(store)
    assert (out.traceback, out.rc) == (None, 2)
    assert out.stderr == (f"lmz: could not write out copy {copy.name} to restore the catalog: No space left on "
                          f"device (the disk holding the store is full: 0 bytes free); nothing was changed\n")
    assert store_files(store) == before       # no half-written catalog, no leftover file
    filler.unlink()
    assert repair(store).rc == 0
    assert verify_store(store).ok


def _pages_of(path: Path, table: str) -> list[int]:
    """The 0-based page numbers of a table's b-tree in a catalog file (read from a scratch copy)."""
    scratch = path.with_name("pages-scratch.sqlite")
    scratch.write_bytes(path.read_bytes())
    db = sqlite3.connect(scratch)
    try:
        return [n - 1 for (n,) in db.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))]
    finally:
        db.close()
        scratch.unlink()


def test_a_running_mount_keeps_opening_its_files_when_the_catalogs_models_page_goes_bad(tmp_path):
    from lmzfs.testing.mount import mounted
    store = store_of_two(tmp_path)
    want = file_digests(store.root)
    (page,) = _pages_of(store.catalog, "models")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root) as fs:
        assert sorted(p.relative_to(mnt).as_posix() for p in mnt.rglob("*") if p.is_file()
                      and ".lmzfs" not in p.parts) == sorted(want)
        damage_file(store.catalog, Damage("zero-page", page * PAGE))
        for _ in range(2):          # every open, not only the first
            for name, digest in want.items():
                assert hashlib.sha256((mnt / name).read_bytes()).hexdigest() == digest
        log = fs.log()
    # one line says so, naming the copy files open from; no open failed
    assert log.count("files open from its copy catalog.sqlite.copy-0000000002 until it is repaired") == 1, log
    assert "Traceback" not in log
    assert diagnose(store).problem is not None          # the file on disk is still damaged: repair is due


def test_ls_names_damage_in_a_page_no_listing_reads(tmp_path, capsys):
    store = store_of_two(tmp_path)
    (page,) = _pages_of(store.catalog, "chunks_by_pack")        # an index no listing query uses
    damage_file(store.catalog, Damage("zero-page", page * PAGE))
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "ls"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmz: catalog {store.catalog} is damaged: run lmz verify --repair (") and err.count("\n") == 1


def _chunks_by_model(store: StorePaths) -> dict[str, set[bytes]]:
    db = sqlite3.connect(f"file:{store.catalog}?mode=ro", uri=True)
    try:
        out: dict[str, set[bytes]] = {}
        for name, cid in db.execute("SELECT m.name, e.chunk FROM extents e JOIN files f ON f.id = e.file "
                                    "JOIN models m ON m.id = f.model"):
            out.setdefault(name, set()).add(cid)
        return out
    finally:
        db.close()


def test_the_same_page_zeroed_in_the_catalog_and_its_newest_copy_loses_no_models_data(tmp_path):
    """Issue 48's correlated damage: every model comes back from a copy or from the rows the damaged
    file still holds, or is named LOST; and gc keeps every record a LOST model needs until told."""
    from lmzfs.store.catalog.check import index_packs
    from lmzfs.store.catalog.repair import repair_catalog
    base = StorePaths(tmp_path / "base")
    for i in range(3):
        add_model(base, small_model(tmp_path / f"m{i}", seed=40 + i, mib=1), f"m{i}")
    want, chunks = file_digests(base.root), _chunks_by_model(base)
    pages = base.catalog.stat().st_size // PAGE
    recovered = lost = 0
    for page in range(1, pages):
        store = StorePaths(tmp_path / f"page-{page}")
        shutil.copytree(base.root, store.root)
        for f in (store.catalog, list_copies(store.catalog)[0].path):
            damage_file(f, Damage("zero-page", page * PAGE))
        report = repair_catalog(store)
        collect_garbage(store)
        got = file_digests(store.root)
        records = index_packs(store).records
        for model in ("m0", "m1", "m2"):
            files = {k: v for k, v in want.items() if k.startswith(model + "/")}
            if all(got.get(k) == v for k, v in files.items()):
                continue
            # not served: named, with every record it needs still in the packs
            assert model in report.lost_models, (page, model, report)
            assert all(cid in records for cid in chunks[model]), (page, model)
            lost += 1
        recovered += len(report.recovered_models)
        assert verify_store(store).ok
    assert recovered > 0


def test_gc_keeps_what_a_set_aside_catalog_names_until_told_to_forget_it(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    for i in range(3):
        add_model(store, small_model(tmp_path / f"m{i}", seed=50 + i, mib=1), f"m{i}")
    (page,) = _pages_of(store.catalog, "extents")
    for f in (store.catalog, list_copies(store.catalog)[0].path):
        damage_file(f, Damage("zero-page", page * PAGE))
    from lmzfs.cli import main
    assert main(["--store", str(store.root), "verify", "--repair"]) == 1
    assert "LOST m2: " in capsys.readouterr().out
    before = sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp"))
    assert main(["--store", str(store.root), "gc"]) == 0
    out = capsys.readouterr().out
    assert "(set aside by `lmz verify --repair`) still names records in them" in out
    assert sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp")) == before
    assert main(["--store", str(store.root), "gc", "--forget-set-aside"]) == 0
    assert "set aside" not in capsys.readouterr().out
    assert sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp")) < before
    assert not list(store.root.glob("catalog.sqlite.damaged-*"))
    assert verify_store(store).ok


def test_the_catalog_repair_installs_and_the_copy_due_marker_are_the_owners_alone(tmp_path):
    old = os.umask(0o022)
    try:
        store = store_of_two(tmp_path)
        damage_file(store.catalog, Damage("zero-page", 0))
        repair_catalog_report = repair(store)
        assert repair_catalog_report.rc == 0
        assert store.catalog.stat().st_mode & 0o777 == 0o600
        due_marker(store.catalog).unlink(missing_ok=True)
        from lmzfs.store.catalog.copies import mark_copy_due
        mark_copy_due(store.catalog)
        assert due_marker(store.catalog).stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
