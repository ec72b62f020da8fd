"""The rewrite passes (`lmz rewrite compact|recode|delta|anchor`): what each does to the bytes, that no served
byte changes (through a real mount too, with a file held open across the pass), and that a pass
killed with kill -9 anywhere leaves the previous state readable and verifiable.

LMZ_REWRITE_KILLS=N kills each pass at N random points instead of the default few.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lmzfs.cli import main as lmz
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.store.rewrite.anchor import anchor_store
from lmzfs.store.rewrite.compact import compact_store
from lmzfs.store.rewrite.delta import delta_store
from lmzfs.store.rewrite.recode import recode_store
from lmzfs.store.gc import collect_garbage
from lmzfs.admin.verify import verify_store
from lmzfs.testing.killpoints import kill_at_point
from lmzfs.testing.mount import mounted
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model
from lmzfs.testing.storedigests import served_digests


def served(store: StorePaths) -> dict[str, str]:
    """SHA-256 of every stored file, read through a fresh reader of the store."""
    return served_digests(store, cache_bytes=0)


def originals(**dirs: Path) -> dict[str, str]:
    return {f"{name}/{p.relative_to(d)}": hashlib.sha256(p.read_bytes()).hexdigest()
            for name, d in dirs.items() for p in sorted(d.rglob("*")) if p.is_file()}


def pack_bytes(store: StorePaths) -> int:
    return sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp"))


def pack_names(store: StorePaths) -> list[str]:
    return sorted(p.name for p in store.packs.glob("pack-*.lmzp"))


def live_payload(store: StorePaths) -> int:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return cat.db.execute("SELECT COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()[0]
    finally:
        cat.close()


def rows(store: StorePaths) -> list[tuple]:
    """Every chunk row, as the catalog holds it."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        return sorted(cat.db.execute("SELECT * FROM chunks").fetchall())
    finally:
        cat.close()


def checkpoints(d: Path, n: int, seed: int = 0, mib: int = 2) -> list[Path]:
    """N checkpoints of one run: FP32 weights, each a small step from the one before."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(mib << 18, dtype=np.float32)
    out = []
    for i in range(n):
        step = d / f"step{i}"
        step.mkdir(parents=True)
        save_file({"w": w, "b": np.arange(384, dtype=np.float32) + i}, str(step / "model.safetensors"))
        (step / "config.json").write_text(json.dumps({"step": i}))
        out.append(step)
        w = w + rng.standard_normal(w.size, dtype=np.float32) * np.float32(1e-3) * np.abs(w)
    return out


def chunk_rows(store: StorePaths, model: str) -> dict[int, tuple]:
    """(size, codec, length, refs, base) of each chunk of MODEL's model.safetensors, by plain offset."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        return {off: row for off, *row in cat.db.execute(
            "SELECT e.offset, c.size, c.codec, c.length, c.refs, c.base FROM extents e JOIN chunks c ON c.id = e.chunk "
            "JOIN files f ON f.id = e.file JOIN models m ON m.id = f.model "
            "WHERE m.name = ? AND f.path = 'model.safetensors'", (model,))}
    finally:
        cat.close()


def chunk_ids(store: StorePaths, model: str) -> dict[int, bytes]:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return dict(cat.db.execute(
            "SELECT e.offset, e.chunk FROM extents e JOIN files f ON f.id = e.file JOIN models m ON m.id = f.model "
            "WHERE m.name = ? AND f.path = 'model.safetensors'", (model,)))
    finally:
        cat.close()


def deepest_chain(store: StorePaths) -> int:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return max(len(e.chain()) - 1 for f in cat.files() for e in cat.extents(f.id))
    finally:
        cat.close()


# -- compact ---------------------------------------------------------------------------------------

def test_compact_after_a_removal_leaves_exactly_the_packs_a_fresh_store_of_the_rest_has(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=1, mib=2), small_model(tmp_path / "b", seed=2, mib=2)
    add_model(store, a, "a", delta=False)
    add_model(store, b, "b", delta=False)
    remove_models(store, ["a"])
    before = pack_bytes(store)
    r = compact_store(store)
    assert (r.before.packs, r.after.packs) == (before, pack_bytes(store))
    assert (r.before.payload, r.after.payload) == (live_payload(store), live_payload(store))
    assert r.chunks_dropped > 0 and r.packs_deleted == 1 and r.packs_written == 1
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, b, "b", delta=False)
    assert pack_bytes(store) == pack_bytes(fresh) < before
    assert served(store) == originals(b=b)
    assert verify_store(store).ok


def test_compact_leaves_a_pack_whose_dead_share_is_below_the_threshold_unless_all(tmp_path, store_dir):
    store = StorePaths(store_dir)
    big, small = small_model(tmp_path / "big", seed=3, mib=4), small_model(tmp_path / "small", seed=4, mib=0)
    add_model(store, big, "big", delta=False)
    add_model(store, small, "small", delta=False)      # appended to the same pack
    remove_models(store, ["small"])
    names, size = pack_names(store), pack_bytes(store)
    unused = sum(1 for row in rows(store) if row[6] == 0)
    r = compact_store(store)
    assert (pack_names(store), pack_bytes(store)) == (names, size)
    assert (r.chunks_dropped, r.packs_written, r.packs_deleted) == (unused, 0, 0) and unused > 0
    assert all(row[6] > 0 for row in rows(store))
    r = compact_store(store, everything=True)
    assert pack_names(store) != names and pack_bytes(store) < size
    assert (r.packs_written, r.packs_deleted, r.chunks_dropped) == (1, 1, 0)
    assert served(store) == originals(big=big)
    again = compact_store(store)
    assert (again.chunks_changed, again.before, pack_names(store)) == (0, again.after, pack_names(store))


def test_compact_deletes_what_a_killed_add_left_behind(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=5, mib=2)
    add_model(store, a, "a", delta=False)
    size = pack_bytes(store)
    (store.packs / "pack-00000009.lmzp").write_bytes(b"LMZPACK\x00" + bytes(8) + os.urandom(5000))
    r = compact_store(store)
    assert r.packs_deleted == 1 and pack_bytes(store) == size
    assert served(store) == originals(a=a)


# -- recode ----------------------------------------------------------------------------------------

def test_recode_of_a_fast_store_stores_what_a_default_add_stores_and_the_same_bytes(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=6, mib=2), small_model(tmp_path / "b", seed=7, mib=2)
    add_model(store, a, "a", fast=True, delta=False)
    add_model(store, b, "b", fast=True, delta=False)
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, a, "a", delta=False)
    add_model(fresh, b, "b", delta=False)
    r = recode_store(store)
    assert r.after.payload == live_payload(fresh) < r.before.payload
    assert r.after.payload == live_payload(store) and r.after.packs == pack_bytes(store)
    # The replaced payloads stay in the packs until compact; the new ones are appended.
    assert r.after.packs > r.before.packs
    assert served(store) == originals(a=a, b=b)
    assert verify_store(store).ok
    assert recode_store(store).chunks_changed == 0
    compact_store(store)
    assert pack_bytes(store) == pack_bytes(fresh)


def test_recode_of_one_model_leaves_the_others_chunks_as_they_were(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=8, mib=2), small_model(tmp_path / "b", seed=9, mib=2)
    add_model(store, a, "a", fast=True, delta=False)
    add_model(store, b, "b", fast=True, delta=False)
    cat = Catalog(store.catalog, readonly=True)
    try:
        b_rows = sorted(cat.db.execute("SELECT c.* FROM chunks c WHERE c.id IN (SELECT e.chunk FROM extents e "
                                       "JOIN files f ON f.id = e.file JOIN models m ON m.id = f.model "
                                       "WHERE m.name = 'b')").fetchall())
    finally:
        cat.close()
    r = recode_store(store, "a")
    assert r.chunks_changed > 0
    assert set(b_rows) <= set(rows(store))
    assert served(store) == originals(a=a, b=b)


def test_recode_keeps_chunks_coded_in_segments_in_segments_and_reports_progress_to_the_end(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a = small_model(tmp_path / "a", seed=11, mib=2)
    add_model(store, a, "a", segments=True, delta=False)
    codecs = sorted(row[2] for row in rows(store))
    assert "floatseg" in codecs
    calls: list[tuple[int, int]] = []
    r = recode_store(store, progress=lambda done, total: calls.append((done, total)))
    assert (r.chunks_changed, sorted(row[2] for row in rows(store))) == (0, codecs)
    assert calls[-1] == (calls[-1][1], sum(row[1] for row in rows(store))) and len(calls) == r.chunks_examined


def test_a_damaged_chunk_stops_recode_and_anchor_with_nothing_changed_and_compact_keeps_it_findable(
        tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2)
    add_model(store, a, "a", fast=True, delta=False)
    add_model(store, b, "b", fast=True, delta=False)
    delta_store(store, "b", "a")
    flip_byte_in_chunk_of(store, "b", "model.safetensors")
    state = rows(store)
    for argv in (["recode"], ["anchor", "b"]):
        assert lmz(["--store", str(store_dir), "rewrite", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("lmz: the rewrite stopped and nothing changed: chunk ") and err.endswith(
            "; run `lmz verify`\n") and err.count("\n") == 1
        assert rows(store) == state
    # compact copies payloads as they are: the damage moves with its chunk, and verify still names it
    compact_store(store, everything=True)
    assert [(d.model, d.path) for d in verify_store(store).damaged] == [("b", "model.safetensors")]
    assert served_but(store, "b/model.safetensors") == {k: v for k, v in originals(a=a, b=b).items()
                                                       if k != "b/model.safetensors"}


def served_but(store: StorePaths, damaged: str) -> dict[str, str]:
    archive = Archive(store.root, cache_bytes=0, workers=0)
    try:
        out = {}
        for e in archive.files():
            if f"{e.model}/{e.path}" != damaged:
                with archive.open(e) as r:
                    out[f"{e.model}/{e.path}"] = hashlib.sha256(r.pread(0, e.size)).hexdigest()
        return out
    finally:
        archive.close()


def test_lmz_rewrite_prints_the_bytes_before_and_after_and_refuses_an_unknown_model(tmp_path, store_dir, capsys):
    a = small_model(tmp_path / "a", seed=10, mib=1)
    store = StorePaths(store_dir)
    add_model(store, a, "a", fast=True, delta=False)
    assert lmz(["--store", str(store_dir), "rewrite", "recode", "nope"]) == 2
    assert capsys.readouterr().err == "lmz: no model named 'nope' (see `lmz ls`)\n"
    before = (live_payload(store), pack_bytes(store))
    assert lmz(["--store", str(store_dir), "rewrite", "recode", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["payload_bytes_before"], out["pack_bytes_before"]) == before
    assert (out["payload_bytes_after"], out["pack_bytes_after"]) == (live_payload(store), pack_bytes(store))
    assert lmz(["--store", str(store_dir), "rewrite", "compact"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("rewrite compact: moved ") and " packs on disk " in line
    assert lmz(["--store", str(tmp_path / "nostore"), "rewrite", "compact"]) == 2
    assert capsys.readouterr().err.startswith("lmz: no lmzfs store at ")


# -- delta and anchor ------------------------------------------------------------------------------

def test_delta_codes_a_checkpoint_against_its_predecessor_smaller_and_its_base_survives_rm(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2)
    add_model(store, a, "run/a", delta=False)
    add_model(store, b, "run/b", delta=False)
    alone = chunk_rows(store, "run/b")
    r = delta_store(store, "run/b", "run/a")
    assert (r.base, r.after.payload, r.after.packs) == ("run/a", live_payload(store), pack_bytes(store))
    assert r.after.payload < r.before.payload
    now, refs = chunk_rows(store, "run/b"), chunk_ids(store, "run/a")
    # The weight chunks are deltas against run/a's chunk at the same offset, each smaller than alone;
    # run/a's chunks count the reference.
    deltas = {off for off, row in now.items() if row[4] is not None}
    assert deltas and r.chunks_changed == len(deltas)
    for off in deltas:
        assert now[off][4] == refs[off] and now[off][2] < alone[off][2]
        assert chunk_rows(store, "run/a")[off][3] == 2
    assert served(store) == originals(**{"run/a": a, "run/b": b})
    remove_models(store, ["run/a"])
    collect_garbage(store)
    compact_store(store, everything=True)
    assert served(store) == originals(**{"run/b": b})
    assert verify_store(store).ok


def test_delta_without_base_picks_the_nearest_checkpoint_and_keeps_every_chain_within_the_cap(tmp_path, store_dir):
    store = StorePaths(store_dir)
    steps = checkpoints(tmp_path, 4, mib=1)
    for i, d in enumerate(steps):
        add_model(store, d, f"run/step{i}", delta=False)
    bases = [delta_store(store, f"run/step{i}", chain_depth=2).base for i in (1, 2, 3)]
    assert bases == ["run/step0", "run/step1", "run/step1"]     # step2 is at depth 2 already
    assert deepest_chain(store) == 2
    assert served(store) == originals(**{f"run/step{i}": d for i, d in enumerate(steps)})
    assert verify_store(store).ok


def test_delta_never_makes_a_loop_and_says_why_it_left_chunks_alone(tmp_path, store_dir, capsys):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2, mib=1)
    add_model(store, a, "a", delta=False)
    add_model(store, b, "b", delta=False)
    delta_store(store, "b", "a")
    looping = sum(1 for row in chunk_rows(store, "b").values() if row[4] is not None)
    r = delta_store(store, "a", "b")
    assert r.notes == [f"{looping} paired chunk(s) left as they are: coding them against b would loop a chain "
                       f"or take it past the depth cap of 4"]
    assert deepest_chain(store) == 1
    assert served(store) == originals(a=a, b=b)
    state = rows(store)
    with pytest.raises(StoreError, match="no other stored model can be a base for 'a'"):
        delta_store(store, "a", chain_depth=1)
    assert lmz(["--store", str(store_dir), "rewrite", "delta", "a", "--base", "a"]) == 2
    assert capsys.readouterr().err == "lmz: 'a' cannot be coded against itself; name another model with --base\n"
    assert lmz(["--store", str(store_dir), "rewrite", "delta", "a", "--base", "zz"]) == 2
    assert capsys.readouterr().err == "lmz: no model named 'zz' (see `lmz ls`)\n"
    assert rows(store) == state


def model_chunks(store: StorePaths, model: str) -> set[bytes]:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return {cid for (cid,) in cat.db.execute("SELECT e.chunk FROM extents e JOIN files f ON f.id = e.file "
                                                 "JOIN models m ON m.id = f.model WHERE m.name = ?", (model,))}
    finally:
        cat.close()


def test_anchor_stores_a_model_alone_again_and_it_outlives_its_former_base_and_gc(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2)
    add_model(store, a, "a", delta=False)
    add_model(store, b, "b", delta=False)
    alone, base_rows = chunk_rows(store, "b"), chunk_rows(store, "a")
    delta_store(store, "b", "a")
    deltas = sum(1 for row in chunk_rows(store, "b").values() if row[4] is not None)
    r = anchor_store(store, "b")
    assert r.chunks_changed == deltas > 0
    assert chunk_rows(store, "b") == alone        # as its add stored it: alone, the same codecs and sizes
    assert chunk_rows(store, "a") == base_rows    # the references it counted are gone
    assert r.after.payload > r.before.payload and r.after.payload == live_payload(store)
    remove_models(store, ["a"])
    collect_garbage(store)
    assert {row[0] for row in rows(store)} == model_chunks(store, "b")
    assert served(store) == originals(b=b)
    assert verify_store(store).ok


def test_anchor_of_a_middle_checkpoint_leaves_the_one_coded_against_it_reading_right(tmp_path, store_dir):
    store = StorePaths(store_dir)
    steps = checkpoints(tmp_path, 3, mib=1)
    for i, d in enumerate(steps):
        add_model(store, d, f"s{i}", delta=False)
    delta_store(store, "s1", "s0")
    delta_store(store, "s2", "s1")
    anchor_store(store, "s1")
    assert all(row[4] is None for row in chunk_rows(store, "s1").values())
    assert any(row[4] is not None for row in chunk_rows(store, "s2").values())
    remove_models(store, ["s0", "s1"])
    collect_garbage(store)
    assert served(store) == originals(s2=steps[2])
    assert deepest_chain(store) == 1
    assert verify_store(store).ok


def test_a_chain_lmz_add_made_is_undone_by_anchor_and_made_again_by_delta(tmp_path, store_dir):
    store = StorePaths(store_dir)
    s0, s1 = checkpoints(tmp_path, 2)
    add_model(store, s0, "run/s0")
    add_model(store, s1, "run/s1")              # recodes run/s0 as deltas against run/s1
    by_add = chunk_rows(store, "run/s0")
    assert any(row[4] is not None for row in by_add.values())
    anchor_store(store, "run/s0")
    assert all(row[4] is None for row in chunk_rows(store, "run/s0").values())
    remove_models(store, ["run/s1"])
    collect_garbage(store)
    assert served(store) == originals(**{"run/s0": s0})
    add_model(store, s1, "run/s1", delta=False)
    assert delta_store(store, "run/s0").base == "run/s1"
    assert chunk_rows(store, "run/s0") == by_add
    assert served(store) == originals(**{"run/s0": s0, "run/s1": s1})
    assert verify_store(store).ok


def test_recode_keeps_each_delta_on_its_own_reference_or_codes_it_alone(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2, mib=1)
    add_model(store, a, "a", fast=True, delta=False)
    add_model(store, b, "b", fast=True, delta=False)
    delta_store(store, "b", "a")
    refs = chunk_ids(store, "a")
    r = recode_store(store)
    assert r.chunks_changed > 0 and r.after.payload < r.before.payload
    assert all(row[4] in (None, refs[off]) for off, row in chunk_rows(store, "b").items())
    assert served(store) == originals(a=a, b=b)
    assert verify_store(store).ok


def delta_bases(store: StorePaths, model: str) -> dict[bytes, bytes]:
    """Each delta chunk of MODEL's model.safetensors -> the chunk it is coded against."""
    return {chunk_ids(store, model)[off]: row[4] for off, row in chunk_rows(store, model).items()
            if row[4] is not None}


def tensor_extent(store: StorePaths, model: str, name: str) -> tuple[int, int]:
    """(offset, size) of a tensor of MODEL's model.safetensors, from the catalog's tensors table."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        [t] = [s.tensor for s in cat.tensors(model) if s.path == "model.safetensors" and s.tensor.name == name]
        return t.offset, t.size
    finally:
        cat.close()


def without_tensor_rows(store: StorePaths) -> None:
    """The store as if its models had been added before catalog version 3: no tensors table rows
    (and a copy of that catalog, as a writer of it would have left)."""
    from lmzfs.store.catalog.copies import write_copy
    db = sqlite3.connect(store.catalog, isolation_level=None)
    try:
        db.execute("DELETE FROM tensors")
        write_copy(db, store.catalog)
    finally:
        db.close()


def test_delta_pairs_by_the_tensors_table_exactly_as_by_parsing_the_stored_files(tmp_path):
    steps = checkpoints(tmp_path / "src", 3, mib=8)
    by_rows, by_parsing = StorePaths(tmp_path / "rows"), StorePaths(tmp_path / "parsed")
    for i, d in enumerate(steps):
        add_model(by_rows, d, f"run/step{i}", delta=False)
    shutil.copytree(by_rows.root, by_parsing.root)
    without_tensor_rows(by_parsing)
    got = {}
    for store in (by_rows, by_parsing):
        r = delta_store(store, "run/step1")
        assert r.base == "run/step0"
        got[store.root.name] = delta_bases(store, "run/step1")
    # every chunk of the weight, against the chunk at the same offset of step0's weight
    offset, size = tensor_extent(by_rows, "run/step1", "w")
    mine, theirs = chunk_ids(by_rows, "run/step1"), chunk_ids(by_rows, "run/step0")
    weight = {mine[off]: theirs[off] for off in mine if offset <= off < offset + size}
    assert len(weight) == 2
    assert got["rows"] == got["parsed"] and weight.items() <= got["rows"].items()
    assert served(by_rows) == served(by_parsing) == originals(**{f"run/step{i}": d for i, d in enumerate(steps)})


def test_delta_chooses_its_base_without_reading_the_other_models_files(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = checkpoints(tmp_path, 2, mib=1)
    add_model(store, a, "run/a", delta=False)
    add_model(store, b, "run/b", delta=False)
    add_model(store, small_model(tmp_path / "other", seed=5, mib=2), "other", delta=False)   # its own header
    cat = Catalog(store.catalog, readonly=True)
    try:
        [f] = [f for f in cat.files("other") if f.path == "model.safetensors"]
        header = cat.extents(f.id)[0]
    finally:
        cat.close()
    with open(store.pack(header.location.pack), "r+b") as pack:     # other's safetensors header, unreadable
        pack.seek(header.location.offset + header.location.length // 2)
        byte = pack.read(1)[0]
        pack.seek(header.location.offset + header.location.length // 2)
        pack.write(bytes([byte ^ 0x10]))
    r = delta_store(store, "run/b")
    assert r.base == "run/a" and r.chunks_changed > 0
    assert verify_store(store, "run/a").ok and verify_store(store, "run/b").ok     # their sources' SHA-256
    assert not verify_store(store, "other").ok


# -- kill -9 ---------------------------------------------------------------------------------------

# Where a pass is stopped: after its first payload is appended, inside the commit's transaction
# before COMMIT, or right after COMMIT (compact: before it unlinks). lmzfs/killpoints.py names them.
STAGES = {"after-append-1": "append:1", "before-commit": "session-commit", "after-commit": "session-committed"}
def _fast_store_with_garbage(tmp_path: Path, store: StorePaths) -> dict[str, str]:
    """Two checkpoints of a run stored with the quick codecs, and the dead chunks of a removed model."""
    a, b = checkpoints(tmp_path / "run", 2, mib=3)
    c = small_model(tmp_path / "c", seed=20, mib=2)
    add_model(store, a, "a", fast=True, delta=False)
    add_model(store, c, "c", fast=True, delta=False)
    add_model(store, b, "b", fast=True, delta=False)
    remove_models(store, ["c"])
    return originals(a=a, b=b)


PASSES = {"compact": ["compact", "--all"], "recode": ["recode"], "delta": ["delta", "b", "--base", "a"],
          "anchor": ["anchor", "b"]}


def _store_for(tmp_path: Path, store: StorePaths, name: str) -> dict[str, str]:
    """The store a pass is killed in: every pass but delta finds b coded against a already."""
    want = _fast_store_with_garbage(tmp_path, store)
    if name != "delta":
        delta_store(store, "b", "a")
    return want


def _state(store: StorePaths) -> tuple:
    """The live payload bytes and every chunk row but where its payload lies (a rerun after a kill
    appends after what the killed run left, or writes a pack of a new id)."""
    return live_payload(store), [r[:3] + r[5:] for r in rows(store)]


def _check_intact(store: StorePaths, want: dict[str, str], states: tuple) -> None:
    assert _state(store) in states
    assert served(store) == want
    assert verify_store(store).ok


def _rewrite_command(root: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "lmzfs", "--store", str(root), "rewrite", *PASSES[name]]


@dataclass(frozen=True)
class _KillCase:
    """A store to kill a pass in, and what the pass leaves when it runs to its end."""
    template: Path
    want: dict[str, str]        # the SHA-256 of every file it serves
    before: tuple               # _state before the pass
    after: tuple                # and after it
    packs_after: int
    started: float              # how long `lmz rewrite` takes to start (imports, and finding no store)
    seconds: float              # how long it takes on this store, start to exit


_KILL_CASES: dict[str, _KillCase] = {}


@pytest.fixture
def kill_case(tmp_path_factory, request, tmp_path) -> tuple[StorePaths, _KillCase]:
    """A fresh copy of the pass's store (built once per pass, for every kill test of it)."""
    name = request.node.callspec.params["name"]
    case = _KILL_CASES.get(name)
    if case is None:
        d = tmp_path_factory.mktemp(f"kill-{name}")
        template = StorePaths(d / "store")
        want = _store_for(d, template, name)
        reference = d / "reference"
        shutil.copytree(template.root, reference)
        t0 = time.monotonic()
        assert subprocess.run(_rewrite_command(d / "nostore", name), capture_output=True).returncode == 2
        t1 = time.monotonic()
        subprocess.run(_rewrite_command(reference, name), check=True, capture_output=True)
        t2 = time.monotonic()
        case = _KILL_CASES[name] = _KillCase(template.root, want, _state(template), _state(StorePaths(reference)),
                                             pack_bytes(StorePaths(reference)), t1 - t0, t2 - t1)
    store = StorePaths(tmp_path / "store")
    shutil.copytree(case.template, store.root)
    return store, case


@pytest.mark.parametrize("name", PASSES)
@pytest.mark.parametrize("stage", STAGES)
def test_a_pass_killed_at_a_stage_leaves_the_previous_or_the_new_state_and_a_rerun_completes(
        kill_case, name, stage):
    store, case = kill_case
    kill_at_point(_rewrite_command(store.root, name), STAGES[stage])
    _check_intact(store, case.want, (case.after,) if stage == "after-commit" else (case.before,))
    assert lmz(["--store", str(store.root), "rewrite", *PASSES[name]]) == 0
    _check_intact(store, case.want, (case.after,))
    if name == "compact":       # which deletes what the killed run left
        assert pack_bytes(store) == case.packs_after


@pytest.mark.parametrize("name", PASSES)
def test_a_pass_killed_after_random_delays_leaves_a_readable_store_each_time_and_a_rerun_completes(
        kill_case, name):
    store, case = kill_case
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for _ in range(int(os.environ.get("LMZ_REWRITE_KILLS", "3"))):
        delay = rng.uniform(min(case.started, case.seconds), case.seconds)    # past the start-up, to the end
        proc = subprocess.Popen(_rewrite_command(store.root, name), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        try:
            _check_intact(store, case.want, (case.before, case.after))
        except AssertionError as exc:
            raise AssertionError(f"after a kill at {delay:.3f} s (seed {seed})") from exc
    assert lmz(["--store", str(store.root), "rewrite", *PASSES[name]]) == 0
    _check_intact(store, case.want, (case.after,))


# -- through a mount -------------------------------------------------------------------------------

@pytest.mark.mount
def test_a_mount_serves_the_same_bytes_during_and_after_every_pass_and_a_file_open_across_them(
        tmp_path, store_dir):
    store = StorePaths(store_dir)
    want = _fast_store_with_garbage(tmp_path, store)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root, "--cache-bytes", str(1 << 20), "--no-readahead") as fs:
        def through_mount() -> dict[str, str]:
            return {f"{p.relative_to(fs.mountpoint)}": hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(fs.mountpoint.rglob("*")) if p.is_file()}

        assert through_mount() == want
        path = fs.mountpoint / "b" / "model.safetensors"     # the file whose chunks every pass rewrites
        expect = (tmp_path / "run" / "step1" / "model.safetensors").read_bytes()
        fd = os.open(path, os.O_RDONLY)
        stop = threading.Event()
        wrong: list[int] = []
        reads = [0]

        def keep_reading() -> None:
            rng = random.Random(1)
            while not stop.is_set():
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)    # past the page cache, to the server
                off = rng.randrange(len(expect))
                if os.pread(fd, 65536, off) != expect[off:off + 65536]:
                    wrong.append(off)
                reads[0] += 1

        reader = threading.Thread(target=keep_reading)
        reader.start()
        try:
            for argv in (["delta", "b"], ["recode"], ["anchor", "b"], ["compact", "--all"]):
                n = reads[0]
                assert lmz(["--store", str(store_dir), "rewrite", *argv]) == 0
                assert reads[0] > n
                assert through_mount() == want
        finally:
            stop.set()
            reader.join()
            os.close(fd)
        assert wrong == []
    assert verify_store(store).ok
