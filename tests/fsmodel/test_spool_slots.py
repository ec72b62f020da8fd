"""Spool records in the slots of records.slots (fsmodel/spoolslots.py): a file written and not yet
committed costs the spool a page of one file, not a file of its own; a kill finds every record
whole, an ID.json written after a slot wins over it, and what a slot file says it does not know
is refused. And the group commit's chunks coded before the store's lock (pre_encode): a file
changed meanwhile is stored as it stands at the commit, never as it was coded."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmzfs.chunker import NEW_STORE_SIZES
from lmzfs.fsmodel.filesystem import Filesystem
from lmzfs.fsmodel.spoolslots import SLOT_BYTES, SLOTS_FILE
from lmzfs.fsmodel.storecommit import FileContent, FileToCommit, commit_files, pre_encode_files
from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.fsrows import EntryMeta
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.testing.fspaths import PathDriver
from lmzfs.testing.spool import record_places, rewrite_header, spool_listing

FILES = 40


def open_fs(store: Path) -> Filesystem:
    return Filesystem(store, cache_bytes=16 << 20, workers=2)


BODY = 'f"file {i}: ".encode() + bytes([i % 251]) * (i * 37 % 1500)'     # up to 1.5 KB: inline


def body_of(i: int) -> bytes:
    return eval(BODY)


def kill_writer(body: str, store: Path) -> None:
    script = textwrap.dedent("""
        import os, signal, sys
        from lmzfs.fsmodel.filesystem import Filesystem
        from lmzfs.testing.fspaths import PathDriver
        fs = Filesystem(sys.argv[1], cache_bytes=1 << 24, workers=1)
        p = PathDriver(fs)
    """) + textwrap.dedent(body) + "os.kill(os.getpid(), signal.SIGKILL)\n"
    run = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()


_MANY_OPEN = f"""
    body_of = lambda i: {BODY}
    p.mkdir("m")
    held = []
    for i in range({FILES}):
        fh = p.open(f"m/f{{i}}", os.O_CREAT | os.O_WRONLY)
        fs.write(fh, 0, body_of(i))
        held.append(fh)                # kept open: nothing is committed before the kill
    p.rename("m/f3", "m/renamed")
    fs.setattr(p.stat("m/f5").inode, mode=0o600)
"""


def test_files_killed_uncommitted_live_in_slots_of_one_file_and_replay_byte_for_byte(store_dir):
    kill_writer(_MANY_OPEN, store_dir)
    listing = spool_listing(StorePaths(store_dir).root)
    assert listing == ["mount.lock"] + sorted(f"{SLOTS_FILE}:{k}" for k in range(1, FILES + 1))
    assert sorted(p.record().path for p in record_places(store_dir)) == \
        sorted(["renamed"] + [f"f{i}" for i in range(FILES) if i != 3])
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == FILES
        p = PathDriver(fs)
        for i in range(FILES):
            assert p.read_file("m/renamed" if i == 3 else f"m/f{i}") == body_of(i)
        assert p.stat("m/f5").mode & 0o777 == 0o600
    finally:
        fs.close()
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]
    assert (StorePaths(store_dir).root / "spool" / SLOTS_FILE).stat().st_size == SLOT_BYTES   # cut back


def test_an_id_json_written_after_a_slot_of_the_same_file_wins_and_the_slot_is_freed(store_dir):
    kill_writer("""
        p.mkdir("m")
        fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
        fs.write(fh, 0, b"older, in its slot")
    """, store_dir)
    (place,) = record_places(store_dir)
    assert place.slot is not None
    older = place.record()
    # as a kill between writing the record as ID.json and freeing its slot leaves it
    from dataclasses import replace
    newer = replace(older, inline=b"newer, in ID.json", size=17, ranges=[(0, 17)])
    (StorePaths(store_dir).root / "spool" / f"{older.spool_id}.json").write_bytes(newer.to_json())
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 1
        assert PathDriver(fs).read_file("m/f") == b"newer, in ID.json"
    finally:
        fs.close()
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]


@pytest.mark.parametrize("field, value", [("version", 2), ("slot size", 8192)])
def test_a_slot_file_of_an_unknown_version_or_slot_size_is_refused_and_kept(store_dir, field, value):
    kill_writer(_MANY_OPEN, store_dir)
    path = StorePaths(store_dir).root / "spool" / SLOTS_FILE
    data = rewrite_header(path, **{"version" if field == "version" else "unit": value})
    with pytest.raises(StoreError, match="is not supported"):
        open_fs(store_dir)
    assert path.read_bytes() == data


def test_a_file_changed_after_its_chunks_were_coded_ahead_is_stored_as_it_stands(store_dir):
    fs = open_fs(store_dir)
    PathDriver(fs).mkdir("m")
    fs.close()
    store = StorePaths(store_dir)
    held = {"a": bytearray(b"the bytes coded ahead of the lock " * 100), "b": bytearray(b"unchanged " * 300)}

    def content(name: str) -> FileContent:
        import io

        class View(io.RawIOBase):
            pos = 0

            def readable(self):
                return True

            def readinto(self, buf):
                data = bytes(held[name][self.pos:self.pos + len(buf)])
                buf[:len(data)] = data
                self.pos += len(data)
                return len(data)

            def seekable(self):
                return True

            def seek(self, offset, whence=0):
                self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else len(held[name]) + offset)
                return self.pos

        return FileContent(io.BufferedReader(View()), lambda length, offset: bytes(held[name][offset:offset + length]),
                           len(held[name]))

    meta = EntryMeta("file", 0o644, os.getuid(), os.getgid(), 1, 1, 1)
    with ThreadPoolExecutor(2) as pool:
        policy = pre_encode_files(pool, [FileToCommit("m", n, content(n), meta, None, None) for n in held],
                                  NEW_STORE_SIZES)
        assert len(policy.coded) == 2
        held["a"][:3] = b"THE"                                       # written after the coding
        catalog = Catalog(store.catalog)
        try:
            with WriterLock(store.lock):
                done = commit_files(store, catalog, pool, 2, [FileToCommit("m", n, content(n), meta, None, None)
                                                            for n in held], catalog.chunk_sizes(), policy=policy)
        finally:
            catalog.close()
    assert [d.sha256 for d in done] == [hashlib.sha256(bytes(held[n])).hexdigest() for n in held]
    fs = open_fs(store_dir)
    try:
        p = PathDriver(fs)
        assert p.read_file("m/a") == bytes(held["a"]) and p.read_file("m/a").startswith(b"THE bytes")
        assert p.read_file("m/b") == bytes(held["b"])
    finally:
        fs.close()


def test_between_two_parts_of_a_commit_every_namespace_change_waiting_for_the_lock_goes_first(store_dir):
    import threading
    import time
    from lmzfs.fsmodel.catalogsync import CatalogSync, open_catalog
    from lmzfs.fsmodel.namespace import Namespace
    open_fs(store_dir).close()                       # a store with the writable mount's tables
    store = StorePaths(store_dir)
    sync = CatalogSync(store, open_catalog(store), Namespace(os.getuid(), os.getgid()))
    order, held, let_go = [], threading.Event(), threading.Event()

    def other_holder():                              # keeps the lock (as a slow part would)
        with sync.changing(namespace=False):
            held.set()
            let_go.wait(10)

    def namespace_change():                          # (a mkdir, a directory's chmod ...)
        with sync.changing():
            order.append("namespace change")

    try:
        holder = threading.Thread(target=other_holder)
        holder.start()
        held.wait(5)
        change = threading.Thread(target=namespace_change)
        change.start()
        while not sync.changes_waiting():
            time.sleep(0.001)
        t0 = time.monotonic()
        sync.let_changes_in(longest=0.3)             # the change cannot have the lock: it waits it out
        assert time.monotonic() - t0 >= 0.3 and order == []
        let_go.set()
        sync.let_changes_in(longest=10)              # returns once the change has the lock
        with sync.changing(namespace=False):
            order.append("next part")
        holder.join(5)
        change.join(5)
    finally:
        sync.close()
    assert order == ["namespace change", "next part"]


def test_a_file_closed_during_a_burst_of_writes_is_committed_after_the_burst_not_during_it(store_dir):
    """A burst of writes (rsync, tar, a build) goes first: the commit a close queued waits for a
    lull (QUIET_SECONDS without a change), then commits. The burst writes every few milliseconds;
    a round in which the writer itself stalled for a lull (a loaded machine) proves nothing and
    is run again."""
    import time
    from lmzfs.fsmodel.commit import QUIET_SECONDS
    from lmzfs.fsmodel.spool import pending_records
    fs = Filesystem(store_dir, cache_bytes=16 << 20, workers=2, background_commits=True)
    try:
        p = PathDriver(fs)
        p.mkdir("m")
        for attempt in range(5):
            deadline = time.monotonic() + 30
            while pending_records(store_dir) and time.monotonic() < deadline:
                time.sleep(0.01)                 # what an earlier round left is committed first
            name = f"m/closed-{attempt}"
            fh = p.open(name, os.O_CREAT | os.O_WRONLY)
            fs.write(fh, 0, b"closed before the burst")
            fs.release(fh)                       # its commit is queued now
            burst = p.open(f"m/burst-{attempt}", os.O_CREAT | os.O_WRONLY)
            stamps = [time.monotonic()]
            while stamps[-1] - stamps[0] < 0.5:
                fs.write(burst, 0, b"%d" % len(stamps))
                time.sleep(0.002)
                stamps.append(time.monotonic())
            pending = pending_records(store_dir)
            longest_gap = max(b - a for a, b in zip(stamps, stamps[1:]))
            fs.release(burst)
            if longest_gap < QUIET_SECONDS / 2:
                break
        else:
            pytest.skip("the writer never ran 0.5 s without a stall here")
        assert pending == 2                      # neither the closed file nor the burst's file is committed yet
        deadline = time.monotonic() + 30
        while pending_records(store_dir) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pending_records(store_dir) == 0
        assert p.read_file(name) == b"closed before the burst"
    finally:
        fs.close()
