"""Checkpoint chains: models delta-coded against each other across separate adds.

Small synthetic checkpoints (a drifting F16 tensor, an int8 tensor of which a few values change
per step, a bias) stand in for a training run; every claim is on bytes read back."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lmzfs.cli import main as lmz
from lmzfs.errors import CorruptChunk
from lmzfs.reader.archive import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog, CatalogDamaged
from lmzfs.store.catalog.check import examine
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.admin.verify import verify_store
from lmzfs.testing.mount import mounted
from lmzfs.testing.storedigests import served_digests


def checkpoints(root: Path, n: int, seed: int = 0, size: int = 1 << 19) -> list[Path]:
    """n checkpoint directories of one run: model.safetensors (w: F16 drifting a little per step,
    q: int8 with 5% of its values redrawn per step, b: F32) and a config.json."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float16)
    q = rng.integers(-127, 127, size, dtype=np.int8)
    b = rng.standard_normal(256).astype(np.float32)
    out = []
    for k in range(n):
        w = (w + (rng.standard_normal(size) * 1e-3).astype(np.float16)).astype(np.float16)
        q = q.copy()
        redrawn = rng.random(size) < 0.05
        q[redrawn] = rng.integers(-127, 127, int(redrawn.sum()), dtype=np.int8)
        b = b + rng.standard_normal(256).astype(np.float32)
        d = root / f"step-{k}"
        d.mkdir(parents=True)
        save_file({"w": w, "q": q, "b": b}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps({"step": k}))
        out.append(d)
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def originals(dirs: list[Path], names: list[str]) -> dict[str, str]:
    return {f"{name}/{p.name}": sha(p) for d, name in zip(dirs, names) for p in sorted(d.iterdir())}


def served(store: StorePaths) -> dict[str, str]:
    """SHA-256 of every stored file, read back through the chunk source."""
    return served_digests(store)


def depths(store: StorePaths, model: str, path: str = "model.safetensors") -> list[int]:
    """How many references a read of each chunk of the file follows."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        f = next(f for f in cat.files(model) if f.path == path)
        return [len(e.chain()) - 1 for e in cat.extents(f.id)]
    finally:
        cat.close()


def needed_chunks(store: StorePaths) -> set[bytes]:
    """Every chunk a stored file's read needs: its extents' chunks and their chains."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        return {c.chunk_id for f in cat.files() for e in cat.extents(f.id) for c in e.chain()}
    finally:
        cat.close()


def extents_of(store: StorePaths, model: str):
    cat = Catalog(store.catalog, readonly=True)
    try:
        return [c for f in cat.files(model) for e in cat.extents(f.id) for c in e.chain()]
    finally:
        cat.close()


def stored_chunks(store: StorePaths) -> set[bytes]:
    db = sqlite3.connect(store.catalog)
    try:
        return {r[0] for r in db.execute("SELECT id FROM chunks")}
    finally:
        db.close()


def add_chain(store: StorePaths, dirs: list[Path], **kw) -> list[str]:
    names = [f"run1/step-{k}" for k in range(len(dirs))]
    for d, name in zip(dirs, names):
        add_model(store, d, name, **kw)
    return names


def test_the_newest_is_stored_whole_and_each_older_member_one_reference_deeper(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 4)
    names = add_chain(store, dirs)
    assert served(store) == originals(dirs, names)
    # the header and config chunks are shared or alone; the tensors chain, newest to oldest
    assert max(depths(store, names[3])) == 0
    assert [max(depths(store, n)) for n in names] == [3, 2, 1, 0]
    assert verify_store(store).ok


def test_a_chain_of_five_reads_and_verifies_after_each_member_is_removed_in_turn(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 5)
    names = add_chain(store, dirs)
    expected = originals(dirs, names)
    for gone in (names[4], names[0], names[2], names[1], names[3]):     # the newest (everyone's base) first
        remove_models(store, [gone])
        expected = {k: v for k, v in expected.items() if not k.startswith(gone + "/")}
        assert served(store) == expected
        assert verify_store(store).ok
        collect_garbage(store)
        assert stored_chunks(store) == needed_chunks(store)
        assert served(store) == expected
        assert verify_store(store).ok
    assert stored_chunks(store) == set()


def test_gc_after_rm_collects_exactly_what_no_one_needs_cascading_down_a_chain(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 3)
    names = add_chain(store, dirs)
    expected = originals(dirs, names)
    remove_models(store, [names[1]])            # the middle: its chunks are step-0's references
    before = stored_chunks(store)
    r = collect_garbage(store)
    after = stored_chunks(store)
    assert after == needed_chunks(store) and r.chunks_dropped == len(before - after) > 0
    assert {e.chunk_id for e in extents_of(store, names[0])} - after == set()
    remove_models(store, [names[0]])            # now step-1's tensors serve no one: they go with step-0's
    collect_garbage(store)
    assert stored_chunks(store) == needed_chunks(store)
    assert served(store) == {k: v for k, v in expected.items() if k.startswith(names[2] + "/")}
    assert verify_store(store).ok


def test_ls_shows_which_models_depend_on_which_and_a_removed_base(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    names = add_chain(store, checkpoints(tmp_path / "src", 3))
    assert lmz(["--store", str(store.root), "ls", "--json"]) == 0
    rows = {r["model"]: r["depends_on"] for r in json.loads(capsys.readouterr().out)}
    assert rows == {names[0]: [names[1]], names[1]: [names[2]], names[2]: []}
    remove_models(store, [names[1]])
    assert lmz(["--store", str(store.root), "ls"]) == 0
    out = capsys.readouterr().out
    assert f"  {names[0]} depends on (removed model, chunks kept)\n" in out
    assert names[1] not in out.replace(names[0], "")


def test_lmz_add_says_which_base_it_used_and_what_the_deltas_saved(tmp_path, capsys):
    dirs = checkpoints(tmp_path / "src", 2)
    store = ["--store", str(tmp_path / "store")]
    assert lmz([*store, "add", str(dirs[0]), "--name", "run1/step-0"]) == 0
    out = capsys.readouterr().out
    assert "deltas" not in out and "already in the store" not in out     # an empty store: nothing to say
    assert lmz([*store, "add", str(dirs[1]), "--name", "run1/step-1"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("deltas: run1/step-1 is stored whole; paired with run1/step-0 (chosen: ")
    assert "run1/step-0 now depends on run1/step-1: 2 chunk(s) of it were recoded as deltas" in line


def test_the_base_chosen_is_of_the_same_family_then_the_most_recent(tmp_path):
    store = StorePaths(tmp_path / "store")
    a = checkpoints(tmp_path / "a", 2, seed=1)
    b = checkpoints(tmp_path / "b", 1, seed=2)
    add_model(store, a[0], "run1/step-100")
    add_model(store, b[0], "run2/step-100")          # more recent, another family
    assert add_model(store, a[1], "run1/step-200").base.model == "run1/step-100"
    c = checkpoints(tmp_path / "c", 1, seed=3)
    assert add_model(store, c[0], "other").base.model == "run1/step-200"     # no family: the most recent


def test_no_delta_stores_standalone_and_changes_no_other_model(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 2)
    add_model(store, dirs[0], "run1/step-0")
    before = depths(store, "run1/step-0"), stored_chunks(store)
    assert lmz(["--store", str(store.root), "add", str(dirs[1]), "--name", "run1/step-1", "--no-delta"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "deltas: none (--no-delta): stored standalone, no other model changed"
    assert depths(store, "run1/step-0") == before[0] and before[1] <= stored_chunks(store)
    assert max(depths(store, "run1/step-1")) == 0
    db = sqlite3.connect(store.catalog)
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE base IS NOT NULL").fetchone()[0] == 0
    db.close()


def test_base_of_an_unknown_model_or_one_without_matching_tensors_is_a_clear_error(tmp_path, capsys):
    from safetensors.numpy import save_file
    dirs = checkpoints(tmp_path / "src", 1)
    other = tmp_path / "other"
    other.mkdir()
    save_file({"unrelated": np.zeros(1000, dtype=np.float32)}, str(other / "model.safetensors"))
    store = ["--store", str(tmp_path / "store")]
    assert lmz([*store, "add", str(dirs[0]), "--name", "run1/step-0"]) == 0
    capsys.readouterr()
    assert lmz([*store, "add", str(other), "--base", "nope"]) == 2
    assert capsys.readouterr().err == "lmz: no model named 'nope' to use as a base (see `lmz ls`); nothing was added\n"
    assert lmz([*store, "add", str(other), "--base", "run1/step-0"]) == 2
    assert capsys.readouterr().err == ("lmz: model 'run1/step-0' has no tensor of the same name, dtype and shape as "
                                       "the new model's, so it cannot be a base; nothing was added (leave out "
                                       "--base to choose one, or --no-delta)\n")
    cat = Catalog(StorePaths(tmp_path / "store").catalog, readonly=True)
    assert [m.name for m in cat.models()] == ["run1/step-0"]
    cat.close()
    with pytest.raises(StoreError, match="contradict"):
        add_model(StorePaths(tmp_path / "store"), other, "x", base="run1/step-0", delta=False)


def test_the_depth_cap_re_anchors_the_deepest_and_every_member_still_reads(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 6)
    names = [f"run1/step-{k}" for k in range(6)]
    results = [add_model(store, d, n, chain_depth=2) for d, n in zip(dirs, names)]
    assert all(max(depths(store, n)) <= 2 for n in names)
    assert results[3].recoded.reanchored > 0 and results[3].recoded.reanchor_after < results[3].recoded.reanchor_before * 4
    assert served(store) == originals(dirs, names)
    assert verify_store(store).ok
    assert add_model(store, checkpoints(tmp_path / "more", 1, seed=9)[0], "x", chain_depth=4).base is not None
    assert all(max(depths(store, n)) <= 4 for n in names)


def flip_in_payload(store: StorePaths, model: str, offset: int) -> bytes:
    """Flip a byte in the middle of the payload of the chunk at plain `offset` of MODEL's
    model.safetensors; returns the chunk's id."""
    cat = Catalog(store.catalog, readonly=True)
    try:
        f = next(f for f in cat.files(model) if f.path == "model.safetensors")
        e = next(e for e in cat.extents(f.id) if e.offset == offset)
    finally:
        cat.close()
    with open(store.pack(e.location.pack), "r+b") as fh:
        pos = e.location.offset + e.location.length // 2
        fh.seek(pos)
        byte = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([byte[0] ^ 0x10]))
    return e.chunk_id


def tensor_offset(path: Path, name: str) -> int:
    header = path.read_bytes()
    n = int.from_bytes(header[:8], "little")
    return 8 + n + json.loads(header[8:8 + n])[name]["data_offsets"][0]


def test_a_damaged_reference_is_an_eio_in_every_dependant_that_needs_it_and_nowhere_else(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 3)
    names = add_chain(store, dirs)
    at = tensor_offset(dirs[1] / "model.safetensors", "q")
    assert at == tensor_offset(dirs[0] / "model.safetensors", "q")
    damaged = flip_in_payload(store, names[1], at)       # step-1's q: a delta, and step-0's q's reference
    archive = Archive(store.root, workers=0)
    try:
        for name, broken in ((names[0], True), (names[1], True), (names[2], False)):
            with archive.open(archive.entry(name, "model.safetensors")) as r:
                if broken:
                    with pytest.raises(CorruptChunk) as exc:
                        r.pread(at, 4096)
                    assert exc.value.errno == errno.EIO and damaged.hex()[:16] in exc.value.strerror
                else:
                    assert r.pread(at, 4096) == (dirs[2] / "model.safetensors").read_bytes()[at:at + 4096]
                w = tensor_offset(dirs[0] / "model.safetensors", "w")
                assert r.pread(w, 4096) == (dirs[names.index(name)] / "model.safetensors").read_bytes()[w:w + 4096]
    finally:
        archive.close()
    assert lmz(["--store", str(store.root), "verify"]) == 1
    out = capsys.readouterr().out
    assert sorted(line.split(":")[0] for line in out.splitlines() if line.startswith("DAMAGED")) == \
        [f"DAMAGED {names[0]}/model.safetensors", f"DAMAGED {names[1]}/model.safetensors"]
    assert "its reference chunk" in next(line for line in out.splitlines() if line.startswith(f"DAMAGED {names[0]}"))


@pytest.mark.mount
def test_the_newest_and_the_oldest_checkpoint_read_through_a_mount_equal_their_originals(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 5)
    names = add_chain(store, dirs)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root):
        for d, name in ((dirs[4], names[4]), (dirs[0], names[0])):
            for p in d.iterdir():
                assert sha(mnt / name / p.name) == sha(p)
    at = tensor_offset(dirs[3] / "model.safetensors", "q")
    flip_in_payload(store, names[3], at)        # step-3's q: step-0 to step-2 decode through it
    with mounted(mnt, store.root):
        for k, name in enumerate(names):
            fd = os.open(mnt / name / "model.safetensors", os.O_RDONLY)
            try:
                if k == 4:
                    assert os.pread(fd, 4096, at) == (dirs[4] / "model.safetensors").read_bytes()[at:at + 4096]
                else:
                    with pytest.raises(OSError) as exc:
                        os.pread(fd, 4096, at)
                    assert exc.value.errno == errno.EIO
            finally:
                os.close(fd)


def test_a_version_2_store_is_read_upgraded_by_the_next_add_and_its_models_are_not_picked(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 2)
    add_model(store, dirs[0], "run1/step-0")
    for copy in store.root.glob("catalog.sqlite.copy-*"):
        copy.unlink()
    db = sqlite3.connect(store.catalog)
    for statement in ("DROP INDEX chunks_by_base", "ALTER TABLE chunks DROP COLUMN base", "DROP TABLE tensors",
                      "UPDATE meta SET value = '2' WHERE key = 'catalog_version'"):
        db.execute(statement)
    db.commit()
    db.close()
    assert served(store) == originals(dirs[:1], ["run1/step-0"])
    with pytest.raises(StoreError, match="has no tensor list"):
        add_model(store, dirs[1], "run1/step-1", base="run1/step-0")
    assert add_model(store, dirs[1], "run1/step-1").base is None
    cat = Catalog(store.catalog, readonly=True)
    assert cat.version == "3" and [m.name for m in cat.models()] == ["run1/step-0", "run1/step-1"]
    cat.close()
    assert served(store) == originals(dirs, ["run1/step-0", "run1/step-1"]) and verify_store(store).ok


def test_a_cycle_or_a_missing_reference_in_the_catalog_is_damage(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 2)
    names = add_chain(store, dirs)
    for copy in store.root.glob("catalog.sqlite.copy-*"):
        copy.unlink()
    db = sqlite3.connect(store.catalog)
    (delta, base), = db.execute("SELECT id, base FROM chunks WHERE base IS NOT NULL AND size = "
                                "(SELECT MIN(size) FROM chunks WHERE base IS NOT NULL) LIMIT 1").fetchall()
    db.execute("UPDATE chunks SET base = ? WHERE id = ?", (delta, base))       # base -> delta -> base
    db.commit()
    archive = Archive(store.root, workers=0)
    try:
        with pytest.raises(CatalogDamaged, match="form a cycle"):
            archive.open(archive.entry(names[0], "model.safetensors"))
    finally:
        archive.close()
    db.execute("UPDATE chunks SET base = ? WHERE id = ?", (b"\x07" * 32, base))
    db.commit()
    db.close()
    assert examine(store.catalog).problem == "a chunk's reference is not in the catalog, or is of another size"


def _add_process(store: Path, src: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lmzfs", "--store", str(store), "add", str(src), "--name", name,
                             "--chain-depth", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill_9_of_an_add_while_it_recodes_a_chain_leaves_the_previous_state_intact(tmp_path):
    import shutil
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 4, size=2 << 20)
    names = add_chain(store, dirs[:3], chain_depth=2)
    before = served(store)
    trial = tmp_path / "untouched"
    shutil.copytree(store.root, trial)
    t0 = time.monotonic()
    assert _add_process(trial, dirs[3], "run1/step-3").wait() == 0
    took = time.monotonic() - t0
    assert max(depths(StorePaths(trial), names[0])) <= 2
    rng = np.random.default_rng(7)
    after = {**before, **originals(dirs[3:], ["run1/step-3"])}
    midway = 0
    # past the interpreter's start-up: before the commit, and after it, while the recoded chunks'
    # old payloads are reclaimed
    for i, at in enumerate(np.concatenate([rng.uniform(0.25, 0.7, 4), rng.uniform(0.7, 1.0, 3)]) * took):
        trial = tmp_path / f"trial-{i}"
        shutil.copytree(store.root, trial)
        p = _add_process(trial, dirs[3], "run1/step-3")
        time.sleep(at)
        p.kill()
        rc = p.wait()
        t = StorePaths(trial)
        got = served(t)
        if rc == -9:                # killed before its commit, or after it (copying the catalog, exiting)
            assert got in (before, after)
            midway += got == before
        else:
            assert rc == 0 and got == after
        assert verify_store(t).ok
        collect_garbage(t)
        assert served(t) == got and verify_store(t).ok
        assert pack_bytes(t) == live_pack_bytes(t)
    assert midway >= 1


@pytest.mark.skipif(not os.environ.get("LMZ_CHAIN_CORPUS"), reason="set LMZ_CHAIN_CORPUS=1: adds the quire pair "
                    "(two real int8 releases; about half a minute)")
def test_the_quire_release_pair_chains_reads_back_and_stores_smaller_than_alone(tmp_path):
    from lmzfs.testing.corpus import fetch
    old, new = fetch("quire"), fetch("quire@0.3.1")
    store = StorePaths(tmp_path / "store")
    add_model(store, old, "quire/v0.3.0", fast=True)
    r = add_model(store, new, "quire/v0.3.1", fast=True)
    assert r.base.model == "quire/v0.3.0" and r.recoded.bytes_after < r.recoded.bytes_before
    assert served(store) == {f"quire/v0.3.0/{old.name}": sha(old), f"quire/v0.3.1/{new.name}": sha(new)}
    assert verify_store(store).ok


def pack_bytes(store: StorePaths) -> int:
    return sum(p.stat().st_size for p in store.packs.iterdir())


def live_pack_bytes(store: StorePaths) -> int:
    """What the packs hold with no dead byte: each live record and each pack's header."""
    db = sqlite3.connect(store.catalog)
    try:
        live = db.execute("SELECT SUM(length) + COUNT(*) * 40 FROM chunks").fetchone()[0]
    finally:
        db.close()
    return live + 16 * len(list(store.packs.iterdir()))


def test_an_add_that_recodes_drops_the_old_payloads_from_the_packs_at_once(tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 3)
    names = add_chain(store, dirs[:2])
    assert pack_bytes(store) == live_pack_bytes(store)
    assert lmz(["--store", str(store.root), "add", str(dirs[2]), "--name", "run1/step-2"]) == 0
    out = capsys.readouterr().out
    assert "their old payloads were dropped from the packs (" in out and " reclaimed)" in out
    assert pack_bytes(store) == live_pack_bytes(store)
    assert collect_garbage(store).reclaimed == 0
    assert served(store) == originals(dirs, names + ["run1/step-2"]) and verify_store(store).ok


@pytest.mark.mount
def test_an_add_under_a_mount_leaves_the_old_payloads_and_says_what_gc_will_reclaim(tmp_path, capsys):
    import re
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 2)
    add_model(store, dirs[0], "run1/step-0")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root):
        with open(mnt / "run1/step-0/model.safetensors", "rb") as f:
            f.read(1)
            assert lmz(["--store", str(store.root), "add", str(dirs[1]), "--name", "run1/step-1"]) == 0
    out = capsys.readouterr().out
    said = re.search(r"stay until `lmz gc` \(which will reclaim ([^)]*)\)", out)
    assert said is not None
    dead = pack_bytes(store) - live_pack_bytes(store)
    assert dead > 1 << 19
    from lmzfs.progress import human_bytes
    assert said.group(1) == human_bytes(dead)
    assert collect_garbage(store).reclaimed == dead
    assert served(store) == originals(dirs, ["run1/step-0", "run1/step-1"]) and verify_store(store).ok


def test_verify_of_a_four_deep_chain_decodes_each_stored_chunk_exactly_once(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 5)
    names = add_chain(store, dirs)
    assert max(depths(store, names[0])) == 4
    report = verify_store(store)
    assert report.ok and report.files == 10       # two files a checkpoint
    assert report.chunks_decoded == len(stored_chunks(store))
    # a zero-byte cache decodes a base again for every chunk coded against it, down the chain
    assert verify_store(store, cache_bytes=0).chunks_decoded > 2 * len(stored_chunks(store))


def test_verify_with_its_cache_still_names_every_file_a_damaged_reference_breaks(tmp_path):
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 3)
    names = add_chain(store, dirs)
    db = sqlite3.connect(store.catalog)
    pack, offset, length = db.execute(
        "SELECT c.pack, c.offset, c.length FROM chunks c JOIN extents x ON x.chunk = c.id JOIN files f ON f.id = x.file "
        "JOIN models m ON m.id = f.model WHERE m.name = ? AND c.id IN (SELECT base FROM chunks) LIMIT 1",
        (names[1],)).fetchone()
    db.close()
    with open(store.pack(pack), "r+b") as f:
        f.seek(offset + 40 + length // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    report = verify_store(store)
    assert sorted({d.model for d in report.damaged}) == names[:2]


def test_a_chunk_shared_by_dedup_is_recoded_all_the_same_and_never_into_a_cycle(tmp_path):
    import shutil
    store = StorePaths(tmp_path / "store")
    dirs = checkpoints(tmp_path / "src", 3)
    add_model(store, dirs[0], "run1/step-0")
    add_model(store, dirs[1], "run1/step-1")        # step-0's chunks: deltas against step-1's
    copy = tmp_path / "copy-of-step-1"
    shutil.copytree(dirs[1], copy)
    add_model(store, copy, "elsewhere", delta=False)    # shares every chunk of step-1
    r = add_model(store, dirs[2], "run1/step-2")
    assert r.base.model == "run1/step-1" and r.recoded.chunks == 2
    assert max(depths(store, "elsewhere")) == 1         # recoded with step-1's: a delta against step-2's
    # step-0 again, against step-1 (whose chunks step-0's are coded against, down the chain):
    # recoding step-1's chunks against them would close a cycle, so nothing is recoded
    again = tmp_path / "step-0-again"
    shutil.copytree(dirs[0], again)
    r = add_model(store, again, "run1/step-0-again", base="run1/step-1")
    assert r.recoded.chunks == 0
    expected = {**originals(dirs, ["run1/step-0", "run1/step-1", "run1/step-2"]),
                **originals([copy, again], ["elsewhere", "run1/step-0-again"])}
    assert served(store) == expected and verify_store(store).ok
