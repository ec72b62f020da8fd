"""The writable file system model (lmzfs/fsmodel/), driven without FUSE."""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmzfs.fsmodel.filesystem import RENAME_EXCHANGE, RENAME_NOREPLACE, Filesystem
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.admin.verify import verify_store
from lmzfs.testing.fspaths import PathDriver
from lmzfs.testing.spool import spool_listing, the_record
from lmzfs.testing.synthetic import live_payload_bytes, small_model


def open_fs(store: Path) -> Filesystem:
    return Filesystem(store, cache_bytes=16 << 20, workers=2)


@pytest.fixture
def fs(store_dir):
    filesystem = open_fs(store_dir)
    yield filesystem
    filesystem.close()


@pytest.fixture
def p(fs) -> PathDriver:
    return PathDriver(fs)


def errno_of(call, *args) -> int:
    with pytest.raises(OSError) as info:
        call(*args)
    return info.value.errno


def reopen(fs: Filesystem, store: Path) -> PathDriver:
    fs.close()
    return PathDriver(open_fs(store))


def stored_files(store: Path) -> dict[str, str]:
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return {f"{f.model}/{f.path}": f.sha256 for f in catalog.files()}
    finally:
        catalog.close()


def test_a_file_written_and_closed_reads_back_and_is_stored_with_its_sha256(p, store_dir):
    p.mkdir("m")
    data = os.urandom(100_000) + b"tail"
    p.write_file("m/data.bin", data)
    assert p.read_file("m/data.bin") == data
    assert stored_files(store_dir) == {"m/data.bin": hashlib.sha256(data).hexdigest()}
    assert verify_store(StorePaths(store_dir)).ok


def test_everything_survives_a_remount_directories_symlinks_modes_times_xattrs(fs, p, store_dir):
    p.mkdir("m")
    p.mkdir("m/empty", 0o700)
    p.mkdir("m/d")
    p.write_file("m/d/f.txt", b"text\n")
    p.symlink(b"d/f.txt", "m/link")
    fs.setattr(p.stat("m/d/f.txt").inode, mode=0o600, mtime_ns=1_000_000_000_123, atime_ns=2_000_000_000_000)
    fs.setxattr(p.stat("m/d/f.txt").inode, b"user.note", b"kept")
    p = reopen(fs, store_dir)
    try:
        assert p.listdir("m") == ["d", "empty", "link"]
        assert p.listdir("m/empty") == []
        assert p.stat("m/empty").mode & 0o7777 == 0o700
        st = p.stat("m/d/f.txt")
        assert (st.mode & 0o7777, st.mtime_ns, st.atime_ns) == (0o600, 1_000_000_000_123, 2_000_000_000_000)
        assert p.fs.readlink(p.stat("m/link").inode) == b"d/f.txt"
        assert p.fs.getxattr(st.inode, b"user.note") == b"kept"
        assert p.fs.listxattr(st.inode) == [b"user.note"]
        assert p.read_file("m/d/f.txt") == b"text\n"
    finally:
        p.fs.close()


def test_only_user_xattrs_are_accepted(fs, p):
    p.mkdir("m")
    p.write_file("m/f", b"x")
    inode = p.stat("m/f").inode
    assert errno_of(fs.setxattr, inode, b"trusted.x", b"1") == errno.EOPNOTSUPP
    assert errno_of(fs.getxattr, inode, b"user.none") == errno.ENODATA
    fs.setxattr(inode, b"user.a", b"1")
    fs.removexattr(inode, b"user.a")
    assert fs.listxattr(inode) == []


def test_writes_past_the_end_leave_a_hole_of_zeros(fs, p):
    p.mkdir("m")
    fh = p.open("m/sparse", os.O_CREAT | os.O_RDWR)
    fs.write(fh, 1 << 20, b"end")
    assert fs.read(fh, 0, 4) == b"\0\0\0\0"
    fs.release(fh)
    data = p.read_file("m/sparse")
    assert data == bytes(1 << 20) + b"end"


def test_truncate_down_then_up_reads_zeros_where_the_old_bytes_were(fs, p):
    p.mkdir("m")
    p.write_file("m/f", b"A" * 5000)
    inode = p.stat("m/f").inode
    fs.setattr(inode, size=1000)
    fs.setattr(inode, size=3000)
    assert p.read_file("m/f") == b"A" * 1000 + bytes(2000)


def test_o_trunc_empties_and_o_append_writes_at_the_end(fs, p):
    p.mkdir("m")
    p.write_file("m/log", b"first\n")
    fh = p.open("m/log", os.O_WRONLY | os.O_APPEND)
    fs.write(fh, 0, b"second\n")
    fs.release(fh)
    assert p.read_file("m/log") == b"first\nsecond\n"
    fh = p.open("m/log", os.O_WRONLY | os.O_TRUNC)
    fs.release(fh)
    assert p.read_file("m/log") == b""


def test_o_excl_refuses_an_existing_file(fs, p):
    p.mkdir("m")
    p.write_file("m/f", b"x")
    assert errno_of(p.open, "m/f", os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST


def test_opening_read_write_and_closing_without_writing_commits_nothing(fs, p, store_dir):
    p.mkdir("m")
    p.write_file("m/f", b"x" * 10)
    catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
    generation = catalog.db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    fs.release(p.open("m/f", os.O_RDWR))
    assert catalog.db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone() == generation
    catalog.close()
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]


def test_an_unlinked_open_file_stays_readable_and_writable_until_closed(fs, p, store_dir):
    p.mkdir("m")
    p.write_file("m/f", b"stored bytes")
    fh = p.open("m/f", os.O_RDWR)
    p.unlink("m/f")
    assert p.listdir("m") == []
    fs.write(fh, 0, b"STORED")
    assert fs.read(fh, 0, 100) == b"STORED bytes"
    fs.release(fh)
    assert stored_files(store_dir) == {}
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]


def test_a_file_renamed_while_open_keeps_its_data_and_commits_under_its_new_name(fs, p, store_dir):
    p.mkdir("m")
    p.mkdir("m/d")
    fh = p.open("m/d/f", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"before ")
    p.rename("m/d", "m/e")
    fs.write(fh, 7, b"after")
    fs.release(fh)
    assert p.read_file("m/e/f") == b"before after"
    assert list(stored_files(store_dir)) == ["m/e/f"]


def test_rename_over_a_file_and_over_an_empty_directory_and_the_refusals(fs, p, store_dir):
    p.mkdir("m")
    p.write_file("m/a", b"a")
    p.write_file("m/b", b"b")
    p.rename("m/a", "m/b")
    assert p.listdir("m") == ["b"] and p.read_file("m/b") == b"a"
    p.mkdir("m/d1")
    p.mkdir("m/d2")
    p.write_file("m/d1/x", b"x")
    p.rename("m/d1", "m/d2")
    assert p.listdir("m") == ["b", "d2"] and p.read_file("m/d2/x") == b"x"
    p.mkdir("m/full")
    p.write_file("m/full/y", b"y")
    p.mkdir("m/d3")
    assert errno_of(p.rename, "m/d3", "m/full") == errno.ENOTEMPTY
    assert errno_of(p.rename, "m/b", "m/d3") == errno.EISDIR
    assert errno_of(p.rename, "m/d3", "m/b") == errno.ENOTDIR
    assert errno_of(p.rename, "m/d2", "m/d2/x2") == errno.EINVAL
    p.write_file("m/c", b"c")
    assert errno_of(p.rename, "m/c", "m/b", RENAME_NOREPLACE) == errno.EEXIST
    assert errno_of(p.rename, "m/c", "m/b", RENAME_EXCHANGE) == errno.EINVAL
    assert stored_files(store_dir).keys() == {"m/b", "m/c", "m/d2/x", "m/full/y"}
    assert verify_store(StorePaths(store_dir)).ok


def test_a_model_directory_renames_as_the_model_and_moves_between_models_work(fs, p, store_dir):
    p.mkdir("m")
    p.mkdir("n")
    p.write_file("m/f", b"f")
    p.rename("m/f", "n/f")
    p.rename("n", "renamed")
    assert stored_files(store_dir).keys() == {"renamed/f"}
    assert errno_of(p.rename, "renamed", "m/inside") == errno.EXDEV
    assert errno_of(p.write_file, "top-level-file", b"x") == errno.EPERM


def test_rmdir_of_an_emptied_model_removes_it_like_lmz_rm(fs, p, store_dir):
    p.mkdir("m")
    p.mkdir("m/sub")
    p.write_file("m/sub/f", os.urandom(5000))
    assert errno_of(p.rmdir, "m") == errno.ENOTEMPTY
    p.unlink("m/sub/f")
    p.rmdir("m/sub")
    p.rmdir("m")
    catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
    try:
        assert catalog.models() == []
        assert catalog.db.execute("SELECT COUNT(*) FROM chunks WHERE refs > 0").fetchone()[0] == 0
        assert catalog.db.execute("SELECT COUNT(*) FROM fs_entries").fetchone()[0] == 0
    finally:
        catalog.close()
    collect_garbage(StorePaths(store_dir))
    assert verify_store(StorePaths(store_dir)).ok


def test_a_model_added_by_lmz_add_is_served_and_a_write_into_it_encodes_only_the_chunk_it_touches(
        fs, store_dir, tmp_path):
    fs.close()
    source = small_model(tmp_path / "src", mib=12)
    add_model(StorePaths(store_dir), source, "small")
    original = (source / "model.safetensors").read_bytes()
    fs2 = open_fs(store_dir)
    try:
        p = PathDriver(fs2)
        size = p.stat("small/model.safetensors").size
        assert p.read_file("small/model.safetensors") == original
        catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
        chunks_before = catalog.chunk_count()
        assert chunks_before >= 6
        fh = p.open("small/model.safetensors", os.O_RDWR)
        fs2.write(fh, size // 2, b"\x01\x02\x03\x04" * 1024)
        fs2.release(fh)
        changed = original[:size // 2] + b"\x01\x02\x03\x04" * 1024 + original[size // 2 + 4096:]
        assert p.read_file("small/model.safetensors") == changed
        assert catalog.chunk_count() - chunks_before <= 2
        catalog.close()
    finally:
        fs2.close()
    assert stored_files(store_dir)["small/model.safetensors"] == hashlib.sha256(changed).hexdigest()
    assert verify_store(StorePaths(store_dir)).ok


def test_a_second_filesystem_on_the_same_store_is_refused(fs, store_dir):
    with pytest.raises(StoreError, match="already mounted writable"):
        open_fs(store_dir)


def test_lmz_add_and_rm_beside_the_filesystem_show_up_after_refresh(fs, p, store_dir, tmp_path):
    p.mkdir("mine")
    p.write_file("mine/f", b"mine")
    source = tmp_path / "src"
    source.mkdir()
    (source / "g.txt").write_text("theirs")
    add_model(StorePaths(store_dir), source, "theirs")
    assert fs.refresh()
    assert p.listdir("") == ["mine", "theirs"]
    assert p.read_file("theirs/g.txt") == b"theirs"
    remove_models(StorePaths(store_dir), ["theirs"])
    fs.refresh()
    assert p.listdir("") == ["mine"]
    collect_garbage(StorePaths(store_dir))
    p.write_file("mine/f2", b"after gc")
    assert p.read_file("mine/f") == b"mine"
    assert verify_store(StorePaths(store_dir)).ok


def test_an_idle_file_is_committed_by_commit_idle_while_still_open(fs, p, store_dir):
    p.mkdir("m")
    fh = p.open("m/f", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"idle")
    assert fs.commit_idle(0.0) == 1
    assert list(stored_files(store_dir)) == ["m/f"]
    fs.release(fh)


_CHILD_HEAD = textwrap.dedent("""
    import os, signal, sys
    from lmzfs.fsmodel.filesystem import Filesystem
    from lmzfs.testing.fspaths import PathDriver
    fs = Filesystem(sys.argv[1], cache_bytes=1 << 24, workers=1)
    p = PathDriver(fs)
""")


def killed_child(body: str) -> str:
    """A child's script: fs, a Filesystem of the store in sys.argv[1], and p, its PathDriver;
    then `body`; then SIGKILL of itself, as kill -9 ends a daemon."""
    return _CHILD_HEAD + textwrap.dedent(body) + "os.kill(os.getpid(), signal.SIGKILL)\n"


def kill_writer(script: str, store: Path) -> None:
    run = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()


_KILLED_WRITER = killed_child("""
    p.mkdir("m")
    p.write_file("m/committed", b"closed before the kill")
    fh = p.open("m/committed", os.O_WRONLY)
    fs.write(fh, 0, b"CLOSED")
    fs.fsync(fh)
    fh2 = p.open("m/new", os.O_CREAT | os.O_WRONLY)
    fs.write(fh2, 0, b"fsync'd new file")
    fs.fsync(fh2)
    p.rename("m/new", "m/renamed")     # a rename of a recorded file records it again
""")


def test_fsynced_writes_survive_a_kill_and_are_committed_at_the_next_open(store_dir):
    kill_writer(_KILLED_WRITER, store_dir)
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 2
        p = PathDriver(fs)
        assert p.read_file("m/committed") == b"CLOSED before the kill"
        assert p.read_file("m/renamed") == b"fsync'd new file"
    finally:
        fs.close()
    assert verify_store(StorePaths(store_dir)).ok
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]


_UNSYNCED_WRITER = killed_child("""
    p.mkdir("m")
    p.write_file("m/stored", bytes(range(256)) * 64)
    p.write_file("m/shrunk", b"0123456789" * 100)
    p.write_file("m/appended", b"head:")
    fh = p.open("m/stored", os.O_WRONLY)
    fs.write(fh, 1000, b"MIDDLE")                       # an overwrite in the middle of a stored file
    fh = p.open("m/shrunk", os.O_WRONLY)
    fs.setattr(p.stat("m/shrunk").inode, size=15, fh=fh)
    fh = p.open("m/appended", os.O_WRONLY | os.O_APPEND)
    fs.write(fh, 0, b"one,")
    fs.write(fh, 0, b"two")
    fh = p.open("m/new", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"a new file, ")
    fs.write(fh, 12, b"never fsync'd")
    fh = p.open("m/moved-before", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"written, then renamed")
    p.rename("m/moved-before", "m/moved")
    p.open("m/empty", os.O_CREAT | os.O_WRONLY)
    fh = p.open("m/gone", os.O_CREAT | os.O_WRONLY)
    fs.write(fh, 0, b"unlinked before the kill")
    p.unlink("m/gone")
""")


def test_writes_never_fsynced_survive_a_kill_with_their_names_truncates_and_appends(store_dir):
    kill_writer(_UNSYNCED_WRITER, store_dir)
    fs = open_fs(store_dir)
    try:
        assert fs.replayed == 6
        p = PathDriver(fs)
        assert p.listdir("m") == ["appended", "empty", "moved", "new", "shrunk", "stored"]
        stored = bytearray(bytes(range(256)) * 64)
        stored[1000:1006] = b"MIDDLE"
        assert p.read_file("m/stored") == bytes(stored)
        assert p.read_file("m/shrunk") == b"012345678901234"
        assert p.read_file("m/appended") == b"head:one,two"
        assert p.read_file("m/new") == b"a new file, never fsync'd"
        assert p.read_file("m/moved") == b"written, then renamed"
        assert p.read_file("m/empty") == b""
    finally:
        fs.close()
    assert stored_files(store_dir)["m/stored"] == hashlib.sha256(bytes(stored)).hexdigest()
    assert verify_store(StorePaths(store_dir)).ok
    # the unlinked file, small and new, lived in its record alone (inline), which went with the unlink
    assert spool_listing(StorePaths(store_dir).root) == ["mount.lock"]


_THREE_WRITES = killed_child("""
    p.mkdir("m")
    p.write_file("m/f", b"")          # stored: its writes go to ID.data and the journal (a new file's few
    fh = p.open("m/f", os.O_WRONLY)   # bytes would live in its record alone)
    fs.write(fh, 0, b"aaaa")
    if sys.argv[2] == "fsync":
        fs.fsync(fh)
    fs.write(fh, 4, b"bbbb")
    fs.write(fh, 8, b"cccc")
""")


def spool_file(store: Path, suffix: str) -> Path:
    (path,) = (StorePaths(store).root / "spool").glob(f"*{suffix}")
    return path


def replayed_and_f(store: Path) -> tuple[int, bytes]:
    """How many records a mount of `store` replays, and what m/f then reads."""
    fs = open_fs(store)
    try:
        return fs.replayed, PathDriver(fs).read_file("m/f")
    finally:
        fs.close()


def replayed_f(store: Path) -> bytes:
    fs = open_fs(store)
    try:
        return PathDriver(fs).read_file("m/f")
    finally:
        fs.close()


@pytest.mark.allow_log_warnings
@pytest.mark.parametrize("damage, expected", [
    ("none", b"aaaabbbbcccc"),
    ("cut mid-entry", b"aaaabbbb"),            # the third entry is torn: the first two replay
    ("flip a byte", b"aaaa"),                  # the second entry is damaged: it and what follows are dropped
    ("cut the header", b""),
])
def test_a_torn_or_damaged_journal_replays_its_whole_entries_and_nothing_after(store_dir, damage, expected, caplog):
    from lmzfs.fsmodel.journal import ENTRY_SIZE, HEADER_SIZE
    kill_writer(_THREE_WRITES.replace("sys.argv[2]", "'no'"), store_dir)
    log = spool_file(store_dir, ".log")
    data = bytearray(log.read_bytes())
    assert len(data) == HEADER_SIZE + 3 * ENTRY_SIZE
    if damage == "cut mid-entry":
        data = data[:HEADER_SIZE + 2 * ENTRY_SIZE + 10]
    elif damage == "flip a byte":
        data[HEADER_SIZE + ENTRY_SIZE + 9] ^= 0x40
    elif damage == "cut the header":
        data = data[:HEADER_SIZE - 1]
    log.write_bytes(bytes(data))
    assert replayed_f(store_dir) == expected
    assert ("cannot be trusted" in caplog.text) == (damage != "none")
    assert verify_store(StorePaths(store_dir)).ok


@pytest.mark.allow_log_warnings
def test_an_unsynced_record_from_another_boot_is_set_aside_and_a_durable_one_replays_as_of_its_fsync(
        store_dir, tmp_path, caplog):
    other = tmp_path / "other"
    for store, mode in ((store_dir, "no"), (other, "fsync")):
        kill_writer(_THREE_WRITES.replace("sys.argv[2]", repr(mode)), store)
        the_record(store).edit(boot_id="a-boot-before-a-power-loss")     # unsynced: in a slot; fsync'd: ID.json
    assert replayed_and_f(store_dir) == (0, b"")          # nothing replayed: m/f as stored before the writes
    assert "not replayed, kept as" in caplog.text
    assert spool_file(store_dir, ".json-untrusted").exists() and spool_file(store_dir, ".data").exists()
    assert replayed_f(other) == b"aaaa"
    assert "2 later journal entries are dropped" in caplog.text


@pytest.mark.allow_log_warnings
@pytest.mark.parametrize("restarted", [True, False])
def test_a_torn_unsynced_record_is_set_aside_whole_and_logged_and_the_mount_goes_on(store_dir, restarted, caplog):
    # an unsynced record lives in a slot of records.slots: one torn (a power loss; within one boot,
    # a bad block) cannot be trusted, and may not even name its file: set aside, never replayed
    kill_writer(_THREE_WRITES.replace("sys.argv[2]", "'no'"), store_dir)
    record = the_record(store_dir)
    assert record.slot is not None
    torn = bytearray(record.read())
    torn[len(torn) // 2:] = b"x" * (len(torn) - len(torn) // 2)      # a page written in part, as a power loss may
    record.write(bytes(torn))
    if restarted:       # the last mount ran in another boot (mount.lock names it)
        (StorePaths(store_dir).root / "spool" / "mount.lock").write_text("a-boot-before-a-power-loss\n")
    assert replayed_and_f(store_dir) == (0, b"")          # nothing replayed: m/f as stored before the writes
    assert ("the machine restarted since it was written" in caplog.text) == restarted
    assert "is damaged" in caplog.text and "it is not replayed, kept as" in caplog.text
    assert spool_file(store_dir, ".json-untrusted").read_bytes() == bytes(torn)
    assert [n for n in spool_listing(StorePaths(store_dir).root) if "records.slots" in n] == []


def test_a_damaged_record_of_its_own_file_refuses_the_mount_within_one_boot_and_is_kept(store_dir):
    kill_writer(_THREE_WRITES.replace("sys.argv[2]", "'fsync'"), store_dir)
    record = the_record(store_dir)
    assert record.slot is None                 # fsync'd: durable, ID.json
    torn = bytearray(record.read())
    torn[len(torn) // 2:] = b"x" * (len(torn) - len(torn) // 2)
    record.write(bytes(torn))
    with pytest.raises(StoreError, match="is damaged"):
        open_fs(store_dir)
    assert record.read() == bytes(torn)


@pytest.mark.parametrize("what", ["record", "slot", "journal"])
def test_a_record_or_journal_of_an_unknown_version_is_refused_and_kept(store_dir, what):
    import json
    import struct
    import zlib
    kill_writer(_THREE_WRITES.replace("sys.argv[2]", "'no'" if what == "slot" else "'fsync'"), store_dir)
    if what in ("record", "slot"):
        place = the_record(store_dir)
        assert (place.slot is None) == (what == "record")
        path = place.path
        raw = json.loads(place.read())
        raw["version"] = 5
        place.write(json.dumps(raw).encode())
    else:
        path = spool_file(store_dir, ".log")
        data = bytearray(path.read_bytes())
        data[4:8] = struct.pack("<I", 3)
        data[28:32] = struct.pack("<I", zlib.crc32(bytes(data[:28])))
        path.write_bytes(bytes(data))
    kept = path.read_bytes()
    with pytest.raises(StoreError, match="version . is not supported"):
        open_fs(store_dir)
    assert path.read_bytes() == kept
    with pytest.raises(StoreError, match="version . is not supported"):
        open_fs(store_dir)          # refused again, not "already mounted": the first try let go


def test_the_catalog_copy_follows_on_write_catalog_copy_and_at_close_not_at_every_commit(fs, p, store_dir):
    from lmzfs.store.catalog.copies import list_copies
    catalog_path = StorePaths(store_dir).catalog
    p.mkdir("m")
    before = [c.generation for c in list_copies(catalog_path)]
    p.write_file("m/a", b"a")
    p.write_file("m/b", b"b")
    assert [c.generation for c in list_copies(catalog_path)] == before
    assert fs.write_catalog_copy()
    newest = list_copies(catalog_path)[0].generation
    p.write_file("m/c", b"c")
    fs.close()
    assert list_copies(catalog_path)[0].generation > newest
    from lmzfs.store.catalog.check import diagnose
    assert diagnose(StorePaths(store_dir), check_packs=True).sound


_CHMOD_AFTER_WRITE = killed_child("""
    p.mkdir("m")
    fh = p.open("m/new", os.O_CREAT | os.O_WRONLY, 0o644)
    fs.write(fh, 0, b"written, never fsync'd")
    fs.setattr(p.stat("m/new").inode, mode=0o600, mtime_ns=1_234_000_000_000)
""")


def test_a_chmod_and_utimes_after_unsynced_writes_survive_a_kill_with_the_bytes(store_dir):
    kill_writer(_CHMOD_AFTER_WRITE, store_dir)
    fs = open_fs(store_dir)
    try:
        p = PathDriver(fs)
        assert p.read_file("m/new") == b"written, never fsync'd"
        st = p.stat("m/new")
        assert (st.mode & 0o777, st.mtime_ns) == (0o600, 1_234_000_000_000)
    finally:
        fs.close()


def test_a_checkpoint_written_through_the_mount_recodes_its_predecessor_as_deltas_like_lmz_add(
        tmp_path, store_dir):
    from lmzfs.testing.checkpoints import bf16_checkpoints
    step0, step1 = bf16_checkpoints(tmp_path / "run", 2, rows=512, cols=512)
    add_model(StorePaths(store_dir), step0, "step-0")
    payload_before = live_payload_bytes(store_dir)
    fs = open_fs(store_dir)
    try:
        p = PathDriver(fs)
        p.mkdir("step-1")
        p.write_file("step-1/model.safetensors", (step1 / "model.safetensors").read_bytes())
        assert p.read_file("step-0/model.safetensors") == (step0 / "model.safetensors").read_bytes()
        assert p.read_file("step-1/model.safetensors") == (step1 / "model.safetensors").read_bytes()
    finally:
        fs.close()
    catalog = Catalog(StorePaths(store_dir).catalog, readonly=True)
    try:
        (old,) = [f for f in catalog.files() if f.model == "step-0" and f.path == "model.safetensors"]
        based = [e for e in catalog.extents(old.id) if catalog.chunk_base(e.chunk_id) is not None]
    finally:
        catalog.close()
    assert based, "no chunk of step-0 was recoded against step-1"
    # the new checkpoint costs less than a second whole copy of the model would
    assert live_payload_bytes(store_dir) - payload_before < 0.8 * payload_before
    assert verify_store(StorePaths(store_dir)).ok


def test_a_small_write_into_a_paired_checkpoint_appends_one_chunk_not_the_recoded_ones_again(tmp_path, store_dir):
    from lmzfs.testing.checkpoints import bf16_checkpoints
    step0, step1 = bf16_checkpoints(tmp_path / "run", 2, rows=512, cols=512)
    add_model(StorePaths(store_dir), step0, "step-0")
    fs = open_fs(store_dir)
    try:
        p = PathDriver(fs)
        p.mkdir("step-1")
        data = bytearray((step1 / "model.safetensors").read_bytes())
        p.write_file("step-1/model.safetensors", bytes(data))
        after_first = pack_bytes(store_dir)
        fh = p.open("step-1/model.safetensors", os.O_WRONLY)
        fs.write(fh, len(data) - 8, b"\x01" * 8)     # inside the last tensor (the bias)
        fs.release(fh)
        data[-8:] = b"\x01" * 8
        assert p.read_file("step-1/model.safetensors") == bytes(data)
    finally:
        fs.close()
    # one new chunk appended: the weight matrix's chunks are not recoded a second time
    assert pack_bytes(store_dir) - after_first < 16 << 10
    assert verify_store(StorePaths(store_dir)).ok


def pack_bytes(store: Path) -> int:
    return sum(f.stat().st_size for f in (StorePaths(store).root / "packs").iterdir())


def test_st_blocks_count_the_bytes_written_and_stored_never_a_sparse_files_holes(fs, p, store_dir):
    import random
    p.mkdir("m")
    fh = p.open("m/f", os.O_RDWR | os.O_CREAT)
    rng, written = random.Random(5), set()
    for _ in range(30):                             # 30 writes of 1 to 3000 bytes below 40 MiB
        offset, n = rng.randrange(40 << 20), rng.randint(1, 3000)
        fs.write(fh, offset, b"w" * n)
        written.update(range(offset, offset + n))
    assert fs.getattr(p.stat("m/f").inode).blocks == (len(written) + 511) // 512
    fs.setattr(p.stat("m/f").inode, size=20 << 20, fh=fh)
    cut = len([b for b in written if b < 20 << 20])
    assert p.stat("m/f").blocks == (cut + 511) // 512
    fs.release(fh)                                  # committed: 1 MiB chunks, those of zeros a hole
    chunks = {b >> 20 for b in written if b < 20 << 20}
    assert p.stat("m/f").blocks == len(chunks) * (1 << 20) // 512
    fh = p.open("m/f", os.O_RDWR)
    hole = next(c for c in range(20) if c not in chunks)
    fs.write(fh, (hole << 20) + 100, b"x" * 1024)   # into a stored hole
    assert p.stat("m/f").blocks == len(chunks) * (1 << 20) // 512 + 2
    fs.release(fh)
    assert p.stat("m/f").blocks == (len(chunks) + 1) * (1 << 20) // 512
    p = reopen(fs, store_dir)
    assert p.stat("m/f").blocks == (len(chunks) + 1) * (1 << 20) // 512
    p.fs.close()


@pytest.mark.allow_log_warnings
def test_closing_commits_the_small_files_and_keeps_durably_a_file_whose_commit_finds_the_disk_full(tmpfs):
    disk = tmpfs("48m")
    store = disk / "store"
    fs = open_fs(store)
    p = PathDriver(fs)
    p.mkdir("m")
    big = os.urandom(12 << 20)
    small = {f"m/s{i:03d}.txt": f"line {i}\n".encode() * 20 for i in range(40)}
    fh = p.open("m/big.bin", os.O_CREAT | os.O_WRONLY)      # left open: uncommitted until close
    fs.write(fh, 0, big)
    for path, data in small.items():
        fs.write(p.open(path, os.O_CREAT | os.O_WRONLY), 0, data)
    # room for the small files' commits and a record, none for the big file's chunks
    room = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * (room.f_bavail * room.f_frsize - (4 << 20)))
    fs.close()
    stored = stored_files(store)
    assert {path: stored.get(path) for path in small} == \
        {path: hashlib.sha256(data).hexdigest() for path, data in small.items()}
    assert "m/big.bin" not in stored
    assert [name for name in spool_listing(store) if name.endswith(".json")] != []   # its durable record
    (disk / "filler").unlink()
    again = PathDriver(open_fs(store))      # commits what the spool kept
    try:
        assert again.read_file("m/big.bin") == big
        assert stored_files(store)["m/big.bin"] == hashlib.sha256(big).hexdigest()
    finally:
        again.fs.close()
    assert verify_store(StorePaths(store)).ok
