"""The rewrite passes (`lmz rewrite compact|recode`): what each does to the bytes, that no served
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
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lmzfs.cli import main as lmz
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.store.rewritecompact import compact_store
from lmzfs.store.rewriterecode import recode_store
from lmzfs.store.verify import verify_store
from lmzfs.testing.mount import mounted
from lmzfs.testing.synthetic import small_model


def served(store: StorePaths) -> dict[str, str]:
    """SHA-256 of every stored file, read through a fresh reader of the store."""
    archive = Archive(store.root, cache_bytes=0, workers=0)
    try:
        out = {}
        for e in archive.files():
            with archive.open(e) as r:
                out[f"{e.model}/{e.path}"] = hashlib.sha256(r.pread(0, e.size)).hexdigest()
        return out
    finally:
        archive.close()


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


# -- compact ---------------------------------------------------------------------------------------

def test_compact_after_a_removal_leaves_exactly_the_packs_a_fresh_store_of_the_rest_has(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=1, mib=2), small_model(tmp_path / "b", seed=2, mib=2)
    add_model(store, a, "a")
    add_model(store, b, "b")
    remove_models(store, ["a"])
    before = pack_bytes(store)
    r = compact_store(store)
    assert (r.before.packs, r.after.packs) == (before, pack_bytes(store))
    assert (r.before.payload, r.after.payload) == (live_payload(store), live_payload(store))
    assert r.chunks_dropped > 0 and r.packs_deleted == 1 and r.packs_written == 1
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, b, "b")
    assert pack_bytes(store) == pack_bytes(fresh) < before
    assert served(store) == originals(b=b)
    assert verify_store(store).ok


def test_compact_leaves_a_pack_whose_dead_share_is_below_the_threshold_unless_all(tmp_path, store_dir):
    store = StorePaths(store_dir)
    big, small = small_model(tmp_path / "big", seed=3, mib=4), small_model(tmp_path / "small", seed=4, mib=0)
    add_model(store, big, "big")
    add_model(store, small, "small")      # appended to the same pack
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
    add_model(store, a, "a")
    size = pack_bytes(store)
    (store.packs / "pack-00000009.lmzp").write_bytes(b"LMZPACK\x00" + bytes(8) + os.urandom(5000))
    r = compact_store(store)
    assert r.packs_deleted == 1 and pack_bytes(store) == size
    assert served(store) == originals(a=a)


# -- recode ----------------------------------------------------------------------------------------

def test_recode_of_a_fast_store_stores_what_a_default_add_stores_and_the_same_bytes(tmp_path, store_dir):
    store = StorePaths(store_dir)
    a, b = small_model(tmp_path / "a", seed=6, mib=2), small_model(tmp_path / "b", seed=7, mib=2)
    add_model(store, a, "a", fast=True)
    add_model(store, b, "b", fast=True)
    fresh = StorePaths(tmp_path / "fresh")
    add_model(fresh, a, "a")
    add_model(fresh, b, "b")
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
    add_model(store, a, "a", fast=True)
    add_model(store, b, "b", fast=True)
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


def test_lmz_rewrite_prints_the_bytes_before_and_after_and_refuses_an_unknown_model(tmp_path, store_dir, capsys):
    a = small_model(tmp_path / "a", seed=10, mib=1)
    store = StorePaths(store_dir)
    add_model(store, a, "a", fast=True)
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


# -- kill -9 ---------------------------------------------------------------------------------------

# Runs one pass through the CLI and stops it at a stage: after the Nth payload appended, inside
# the commit's transaction before COMMIT, or right after COMMIT (compact: before it unlinks).
KILL_SCRIPT = r"""
import sys, time
from lmzfs import cli
from lmzfs.store import catalog, packs
stage = sys.argv[2]
appended = 0
real_append = packs.PackWriter.append
def append(self, *a):
    global appended
    loc = real_append(self, *a)
    appended += 1
    if stage == f"after-append-{appended}":
        print("HERE", flush=True); time.sleep(60)
    return loc
packs.PackWriter.append = append
real_exit = catalog._Transaction.__exit__
def exit_(self, et, ev, tb):
    if et is None and stage == "before-commit":
        print("HERE", flush=True); time.sleep(60)
    real_exit(self, et, ev, tb)
    if et is None and stage == "after-commit":
        print("HERE", flush=True); time.sleep(60)
catalog._Transaction.__exit__ = exit_
cli.main(["--store", sys.argv[1], "rewrite", *sys.argv[3:]])
print("DONE", flush=True)
"""


def _fast_store_with_garbage(tmp_path: Path, store: StorePaths) -> dict[str, str]:
    a, b, c = (small_model(tmp_path / n, seed=20 + i, mib=2) for i, n in enumerate("abc"))
    add_model(store, a, "a", fast=True)
    add_model(store, c, "c", fast=True)
    add_model(store, b, "b", fast=True)
    remove_models(store, ["c"])
    return originals(a=a, b=b)


PASSES = {"compact": ["compact", "--all"], "recode": ["recode"]}


def _state(store: StorePaths) -> tuple:
    """The live payload bytes and every chunk row but where its payload lies (a rerun after a kill
    appends after what the killed run left, or writes a pack of a new id)."""
    return live_payload(store), [r[:3] + r[5:] for r in rows(store)]


def _after_unkilled(tmp_path: Path, store: StorePaths, argv: list[str]) -> tuple:
    """The state the pass leaves on a copy of the store, run to its end."""
    copy = StorePaths(tmp_path / f"reference-{argv[0]}")
    shutil.copytree(store.root, copy.root)
    assert lmz(["--store", str(copy.root), "rewrite", *argv]) == 0
    return _state(copy), pack_bytes(copy)


def _check_intact(store: StorePaths, want: dict[str, str], states: tuple) -> None:
    assert _state(store) in states
    assert served(store) == want
    assert verify_store(store).ok


@pytest.mark.parametrize("name", PASSES)
@pytest.mark.parametrize("stage", ["after-append-1", "after-append-3", "before-commit", "after-commit"])
def test_a_pass_killed_at_a_stage_leaves_the_previous_or_the_new_state_and_a_rerun_completes(
        tmp_path, store_dir, name, stage, capsys):
    store = StorePaths(store_dir)
    want = _fast_store_with_garbage(tmp_path, store)
    before, (after, packs_after) = _state(store), _after_unkilled(tmp_path, store, PASSES[name])
    capsys.readouterr()
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(store_dir), stage, *PASSES[name]],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "HERE"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    _check_intact(store, want, (after,) if stage == "after-commit" else (before,))
    assert lmz(["--store", str(store_dir), "rewrite", *PASSES[name]]) == 0
    _check_intact(store, want, (after,))
    if name == "compact":       # which deletes what the killed run left
        assert pack_bytes(store) == packs_after


@pytest.mark.parametrize("name", PASSES)
def test_a_pass_killed_after_random_delays_leaves_a_readable_store_each_time_and_a_rerun_completes(
        tmp_path, store_dir, name, capsys):
    store = StorePaths(store_dir)
    want = _fast_store_with_garbage(tmp_path, store)
    before, (after, packs_after) = _state(store), _after_unkilled(tmp_path, store, PASSES[name])
    capsys.readouterr()
    def command(root: Path) -> list[str]:
        return [sys.executable, "-m", "lmzfs", "--store", str(root), "rewrite", *PASSES[name]]

    # The length of a whole run, measured on another copy: kills land anywhere inside it.
    copy = tmp_path / "timing"
    shutil.copytree(store.root, copy)
    started = time.monotonic()
    subprocess.run(command(copy), check=True, capture_output=True)
    whole = time.monotonic() - started
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for _ in range(int(os.environ.get("LMZ_REWRITE_KILLS", "3"))):
        delay = rng.uniform(0.2 * whole, whole)
        proc = subprocess.Popen(command(store.root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        try:
            _check_intact(store, want, (before, after))
        except AssertionError as exc:
            raise AssertionError(f"after a kill at {delay:.3f} s (seed {seed})") from exc
    assert lmz(["--store", str(store_dir), "rewrite", *PASSES[name]]) == 0
    _check_intact(store, want, (after,))
    if name == "compact":       # which deletes what the killed run left
        assert pack_bytes(store) == packs_after


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
        path = fs.mountpoint / "a" / "model.safetensors"
        expect = (tmp_path / "a" / "model.safetensors").read_bytes()
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
            for argv in (["recode"], ["compact", "--all"]):
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
