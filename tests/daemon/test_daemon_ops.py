"""The FUSE handlers called directly (no mount) against a FakeArchive."""
from __future__ import annotations

import errno
import logging
import os
import random
import stat

import pyfuse3
import pytest
import trio
import trio.testing

from lmzfs.daemon.operations import LmzOperations
from lmzfs.daemon.tree import ROOT_INODE, DirectoryTree
from lmzfs.testing.fake_archive import DEFAULT_MTIME, FakeArchive

WEIGHTS = random.Random(1).randbytes(300_000)
CONFIG = b'{"hidden_size": 384}'


def make_archive() -> FakeArchive:
    archive = FakeArchive()
    archive.add("minilm", "model.safetensors", WEIGHTS, codecs="bytegroup,zstd")
    archive.add("minilm", "tokenizer/vocab.txt", b"[PAD]\n[UNK]\n", mtime=DEFAULT_MTIME + 5)
    archive.add("run1/step-1000", "config.json", CONFIG)
    archive.add("run1/step-2000", "config.json", CONFIG)
    return archive


def run(async_fn, *args):
    return trio.run(async_fn, *args)


async def resolve(ops: LmzOperations, path: str) -> pyfuse3.EntryAttributes:
    attrs = await ops.getattr(ROOT_INODE)
    for name in path.split("/"):
        attrs = await ops.lookup(attrs.st_ino, name.encode())
    return attrs


async def read_all(ops: LmzOperations, inode: int, size: int, piece: int = 65536) -> bytes:
    info = await ops.open(inode, os.O_RDONLY)
    try:
        return b"".join([await ops.read(info.fh, off, piece) for off in range(0, size, piece)])
    finally:
        await ops.release(info.fh)


async def expect_errno(code: int, awaitable):
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await awaitable
    assert caught.value.errno == code


class ReaddirCollector:
    """Stands in for pyfuse3.readdir_reply: accepts *room* entries per readdir call."""

    def __init__(self, room: int):
        self.room = room
        self.left = room
        self.calls: list[tuple[bytes, int, int]] = []

    def __call__(self, token, name, attrs, next_id):
        if self.left == 0:
            return False
        self.left -= 1
        self.calls.append((name, attrs.st_ino, next_id))
        return True

    async def list(self, ops: LmzOperations, inode: int) -> list[tuple[bytes, int, int]]:
        fh = await ops.opendir(inode)
        start = 0
        try:
            while True:
                self.left, before = self.room, len(self.calls)
                await ops.readdir(fh, start, None)
                if len(self.calls) == before:
                    return self.calls
                start = self.calls[-1][2]
        finally:
            await ops.releasedir(fh)


def test_nested_lookup_and_getattr():
    async def main():
        ops = LmzOperations(make_archive())
        root = await ops.getattr(ROOT_INODE)
        assert stat.S_ISDIR(root.st_mode) and stat.S_IMODE(root.st_mode) == 0o555
        assert root.st_nlink == 2 + 2            # minilm, run1

        run1 = await ops.lookup(ROOT_INODE, b"run1")
        step = await ops.lookup(run1.st_ino, b"step-1000")
        config = await ops.lookup(step.st_ino, b"config.json")
        assert stat.S_ISREG(config.st_mode) and stat.S_IMODE(config.st_mode) == 0o444
        assert config.st_size == len(CONFIG) and config.st_nlink == 1
        assert config.st_mtime_ns == round(DEFAULT_MTIME * 1e9)
        assert (config.st_uid, config.st_gid) == (os.getuid(), os.getgid())
        assert (await ops.getattr(config.st_ino)).st_ino == config.st_ino

        weights = await resolve(ops, "minilm/model.safetensors")
        assert weights.st_size == len(WEIGHTS)
        assert weights.st_blocks == (len(WEIGHTS) + 511) // 512
        vocab = await resolve(ops, "minilm/tokenizer/vocab.txt")
        minilm = await ops.lookup(ROOT_INODE, b"minilm")
        assert minilm.st_mtime_ns == vocab.st_mtime_ns         # newest file below it

        assert (await ops.lookup(step.st_ino, b".")).st_ino == step.st_ino
        assert (await ops.lookup(step.st_ino, b"..")).st_ino == run1.st_ino
        await expect_errno(errno.ENOENT, ops.lookup(ROOT_INODE, b"nope"))
        await expect_errno(errno.ENOENT, ops.lookup(config.st_ino, b"x"))
        await expect_errno(errno.ENOENT, ops.getattr(10_000))
    run(main)


def test_readdir_lists_sorted_entries_and_resumes_at_next_id(monkeypatch):
    archive = FakeArchive()
    names = [f"shard-{i:05d}.bin" for i in range(1000)]
    for i, name in enumerate(random.Random(2).sample(names, len(names))):
        archive.add("big", name, i.to_bytes(4, "big"))
    archive.add("small", "a", b"a")

    async def main():
        ops = LmzOperations(archive)
        collector = ReaddirCollector(room=7)       # a small reply buffer: many readdir calls
        monkeypatch.setattr(pyfuse3, "readdir_reply", collector)
        root = await collector.list(ops, ROOT_INODE)
        assert [name for name, _, _ in root] == [b"big", b"small"]

        collector.calls.clear()
        big = await ops.lookup(ROOT_INODE, b"big")
        listed = await collector.list(ops, big.st_ino)
        assert [name.decode() for name, _, _ in listed] == names       # no skips, no repeats
        for name, inode, _ in listed[:3]:
            assert (await ops.lookup(big.st_ino, name)).st_ino == inode
            # readdirplus handed out one reference, the lookup another
            assert ops.tree.lookup_count(inode) == 2

        await expect_errno(errno.ENOTDIR, ops.opendir(listed[0][1]))
        await expect_errno(errno.EBADF, ops.readdir(12345, 0, None))
    run(main)


def test_read_returns_exact_bytes_at_many_offsets():
    async def main():
        ops = LmzOperations(make_archive())
        weights = await resolve(ops, "minilm/model.safetensors")
        assert await read_all(ops, weights.st_ino, weights.st_size) == WEIGHTS

        info = await ops.open(weights.st_ino, os.O_RDONLY)
        assert info.keep_cache
        rng = random.Random(3)
        for _ in range(300):
            off = rng.randrange(0, len(WEIGHTS) + 10)
            size = rng.choice([1, 7, 4096, 131072, rng.randrange(1, 200_000)])
            assert await ops.read(info.fh, off, size) == WEIGHTS[off:off + size]

        async with trio.open_nursery() as nursery:         # concurrent reads on one handle
            async def check(off):
                assert await ops.read(info.fh, off, 5000) == WEIGHTS[off:off + 5000]
            for off in range(0, len(WEIGHTS), 9999):
                nursery.start_soon(check, off)
        await ops.release(info.fh)
        await expect_errno(errno.EBADF, ops.read(info.fh, 0, 1))
        await expect_errno(errno.EISDIR, ops.open(ROOT_INODE, os.O_RDONLY))
    run(main)


def test_release_closes_readers_and_shutdown_closes_everything():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive, workers=2)
        config = await resolve(ops, "run1/step-1000/config.json")
        first = await ops.open(config.st_ino, os.O_RDONLY)
        await ops.open(config.st_ino, os.O_RDONLY)
        assert archive.open_readers == 2
        await ops.release(first.fh)
        assert archive.open_readers == 1
        ops.close_all()
        assert archive.open_readers == 0 and archive.closed
    run(main)


def test_flush_is_answered_enosys_so_the_kernel_sends_no_more_and_reads_go_on():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive, workers=2)
        config = await resolve(ops, "run1/step-1000/config.json")
        info = await ops.open(config.st_ino, os.O_RDONLY)
        await expect_errno(errno.ENOSYS, ops.flush(info.fh))
        assert await ops.read(info.fh, 0, 100) == CONFIG
        await ops.release(info.fh)
        ops.close_all()
    run(main)


def test_everything_that_writes_is_refused_with_erofs():
    async def main():
        ops = LmzOperations(make_archive())
        config = await resolve(ops, "run1/step-1000/config.json")
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND,
                      os.O_RDONLY | os.O_CREAT):
            await expect_errno(errno.EROFS, ops.open(config.st_ino, flags))
        ino, parent = config.st_ino, ROOT_INODE
        await expect_errno(errno.EROFS, ops.setattr(ino, pyfuse3.EntryAttributes(), None, None, None))
        await expect_errno(errno.EROFS, ops.write(1, 0, b"x"))
        await expect_errno(errno.EROFS, ops.create(parent, b"new", 0o644, os.O_WRONLY, None))
        await expect_errno(errno.EROFS, ops.mknod(parent, b"new", 0o644, 0, None))
        await expect_errno(errno.EROFS, ops.mkdir(parent, b"new", 0o755, None))
        await expect_errno(errno.EROFS, ops.unlink(parent, b"minilm", None))
        await expect_errno(errno.EROFS, ops.rmdir(parent, b"minilm", None))
        await expect_errno(errno.EROFS, ops.rename(parent, b"minilm", parent, b"x", 0, None))
        await expect_errno(errno.EROFS, ops.link(ino, parent, b"x", None))
        await expect_errno(errno.EROFS, ops.symlink(parent, b"x", b"minilm", None))
        await expect_errno(errno.EROFS, ops.setxattr(ino, b"user.x", b"1", None))
        await expect_errno(errno.EROFS, ops.removexattr(ino, b"user.lmz.sha256", None))
    run(main)


def test_xattrs_describe_each_file():
    archive = make_archive()
    entry = next(e for e in archive.files() if e.path == "model.safetensors")

    async def main():
        ops = LmzOperations(archive)
        weights = await resolve(ops, "minilm/model.safetensors")
        assert await ops.listxattr(weights.st_ino) == [
            b"user.lmz.sha256", b"user.lmz.stored_bytes", b"user.lmz.codec"]
        assert await ops.getxattr(weights.st_ino, b"user.lmz.sha256") == entry.sha256.encode()
        assert await ops.getxattr(weights.st_ino, b"user.lmz.stored_bytes") == str(entry.stored_bytes).encode()
        assert await ops.getxattr(weights.st_ino, b"user.lmz.codec") == b"bytegroup,zstd"
        await expect_errno(pyfuse3.ENOATTR, ops.getxattr(weights.st_ino, b"user.other"))
        assert await ops.listxattr(ROOT_INODE) == []
        await expect_errno(pyfuse3.ENOATTR, ops.getxattr(ROOT_INODE, b"user.lmz.sha256"))
    run(main)


def test_statfs_reports_logical_size_and_no_free_space():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive)
        data = await ops.statfs(None)
        logical = len(WEIGHTS) + len(b"[PAD]\n[UNK]\n") + 2 * len(CONFIG)
        assert data.f_bsize == data.f_frsize == 4096
        assert data.f_blocks == (logical + 4095) // 4096
        assert data.f_bfree == data.f_bavail == data.f_ffree == 0
        assert data.f_files == 4
        archive.remove("minilm")
        assert (await ops.statfs(None)).f_files == 2
    run(main)


@pytest.mark.allow_log_warnings
def test_corrupt_range_gives_eio_and_names_the_file(caplog):
    archive = make_archive()
    archive.corrupt("minilm", "model.safetensors", 200_000)

    async def main():
        ops = LmzOperations(archive)
        weights = await resolve(ops, "minilm/model.safetensors")
        info = await ops.open(weights.st_ino, os.O_RDONLY)
        assert await ops.read(info.fh, 0, 131072) == WEIGHTS[:131072]
        with caplog.at_level(logging.ERROR):
            await expect_errno(errno.EIO, ops.read(info.fh, 196608, 131072))
        assert "minilm" in caplog.text and "model.safetensors" in caplog.text and "196608" in caplog.text
        assert await ops.read(info.fh, 262144, 131072) == WEIGHTS[262144:]
        await ops.release(info.fh)
    run(main)


def test_models_added_and_removed_show_up_with_stable_inodes():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive)
        before = {path: (await resolve(ops, path)).st_ino
                  for path in ("minilm", "minilm/model.safetensors", "run1", "run1/step-1000/config.json")}
        await expect_errno(errno.ENOENT, ops.lookup(before["run1"], b"step-3000"))

        archive.add("run1/step-3000", "config.json", CONFIG)
        step3 = await ops.lookup(before["run1"], b"step-3000")          # no remount, no wait
        for path, inode in before.items():
            assert (await resolve(ops, path)).st_ino == inode
        assert step3.st_ino not in before.values()

        archive.remove("run1/step-3000")
        await expect_errno(errno.ENOENT, ops.lookup(before["run1"], b"step-3000"))
        archive.add("run1/step-3000", "config.json", CONFIG)
        again = await ops.lookup(before["run1"], b"step-3000")
        assert again.st_ino > step3.st_ino                                # never reused

        # New bytes at the same path get a new inode: the kernel's cached pages belong to the old.
        old = await resolve(ops, "minilm/model.safetensors")
        archive.add("minilm", "model.safetensors", WEIGHTS[::-1])
        new = await resolve(ops, "minilm/model.safetensors")
        assert new.st_ino != old.st_ino and (await resolve(ops, "minilm")).st_ino == before["minilm"]
    run(main)


def test_removed_entries_are_invalidated_once_mounted(monkeypatch):
    archive = make_archive()
    invalidated = []
    monkeypatch.setattr(pyfuse3, "invalidate_entry_async",
                        lambda parent, name, deleted=0, ignore_enoent=False: invalidated.append((parent, name, deleted)))

    async def main():
        ops = LmzOperations(archive)
        ops.init()                                       # what pyfuse3 calls once mounted
        run1 = await ops.lookup(ROOT_INODE, b"run1")
        step = await ops.lookup(run1.st_ino, b"step-1000")
        config = await ops.lookup(step.st_ino, b"config.json")
        archive.remove("run1/step-1000")
        archive.remove("minilm")                         # never looked up: nothing to invalidate
        await ops.getattr(ROOT_INODE)
        assert invalidated == [(run1.st_ino, b"step-1000", 0)]
        # Still known to the kernel, so still answered, now unlinked.
        assert (await ops.getattr(config.st_ino)).st_nlink == 0
        await ops.forget([(config.st_ino, 1)])
        await expect_errno(errno.ENOENT, ops.getattr(config.st_ino))
    run(main)


def test_open_handle_of_removed_model_keeps_reading():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive)
        weights = await resolve(ops, "minilm/model.safetensors")
        info = await ops.open(weights.st_ino, os.O_RDONLY)
        archive.remove("minilm")
        await expect_errno(errno.ENOENT, ops.lookup(ROOT_INODE, b"minilm"))
        assert await ops.read(info.fh, 1000, 50_000) == WEIGHTS[1000:51_000]
        assert (await ops.getattr(weights.st_ino)).st_size == len(WEIGHTS)
        await expect_errno(errno.ENOENT, ops.open(weights.st_ino, os.O_RDONLY))   # a new open: gone
        await ops.release(info.fh)
        assert archive.open_readers == 0
    run(main)


def test_background_refresh_picks_up_new_models():
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.refresh_periodically, 1.0)
            archive.add("late", "w.bin", b"w")
            await trio.sleep(1.5)
            assert ops.tree.lookup(ROOT_INODE, "late") is not None
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.allow_log_warnings
def test_tree_skips_conflicting_and_invalid_paths(caplog):
    archive = FakeArchive()
    archive.add("a", "b", b"file named b")            # a/b is a file ...
    archive.add("a/b", "c", b"... so model a/b has nowhere to go")
    archive.add("m", "x/../y", b"not a valid path")
    archive.add("m", "ok", b"fine")
    tree = DirectoryTree()
    with caplog.at_level(logging.WARNING):
        tree.refresh(archive)
    a = tree.lookup(ROOT_INODE, "a")
    assert tree.lookup(a.inode, "b").kind == "file"
    assert [n.name for n in tree.children(tree.lookup(ROOT_INODE, "m").inode)] == ["ok"]
    assert "a/b/c" in caplog.text and "x/../y" in caplog.text
    assert tree.refresh(archive) is None                  # same generation: no rebuild


@pytest.mark.allow_log_warnings
def test_a_quick_chunk_is_read_on_the_event_loop_and_its_damage_is_still_eio(caplog):
    archive = FakeArchive()
    archive.add("m", "small.bin", WEIGHTS[:100_000], cheap=True)
    archive.corrupt("m", "small.bin", 90_000)

    async def main():
        ops = LmzOperations(archive)
        attrs = await resolve(ops, "m/small.bin")
        info = await ops.open(attrs.st_ino, os.O_RDONLY)
        assert await ops.read(info.fh, 4096, 8192) == WEIGHTS[4096:12288]
        assert (ops._counters["reads_inline"], ops._counters["reads_threaded"]) == (1, 0)
        with caplog.at_level(logging.ERROR):
            await expect_errno(errno.EIO, ops.read(info.fh, 86016, 8192))
        assert "small.bin" in caplog.text and "86016" in caplog.text
        assert ops._counters["reads_threaded"] == 0
        await ops.release(info.fh)
    run(main)


def test_opens_are_let_through_the_moment_the_kernels_init_is_answered_with_no_fixed_wait():
    # A fresh mount's first open waited for a fixed 50 ms (and a 10 ms poll) after INIT: a third of
    # a cold read of a 100 MB file. The window can be widened as soon as init() has returned.
    from lmzfs.daemon.mount import when_initialised
    ops = LmzOperations(make_archive())
    widened, ready_at = trio.Event(), []

    async def main():
        ops.hold_opens_until(widened)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(when_initialised, ops, None, lambda: ready_at.append(trio.current_time()), widened)
            await trio.sleep(1.0)               # the kernel's INIT comes a second later
            assert not widened.is_set() and ready_at == []
            ops.init()
        assert widened.is_set() and ready_at == [1.0]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_opens_wait_until_the_read_ahead_window_is_widened_then_all_go_through():
    ops = LmzOperations(make_archive())
    widened = trio.Event()
    ops.hold_opens_until(widened)
    opened = []

    async def main():
        attrs = await resolve(ops, "minilm/model.safetensors")

        async def opener():
            opened.append(await ops.open(attrs.st_ino, os.O_RDONLY))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(opener)
            nursery.start_soon(opener)
            await trio.testing.wait_all_tasks_blocked()
            assert opened == []             # held: the kernel would give them the narrow window
            widened.set()
        assert len(opened) == 2
        data = b"".join([await ops.read(opened[0].fh, off, 65536) for off in range(0, len(WEIGHTS), 65536)])
        assert data == WEIGHTS
        for info in opened:
            await ops.release(info.fh)
        # once set, opens are answered at once
        info = await ops.open(attrs.st_ino, os.O_RDONLY)
        await ops.release(info.fh)

    run(main)


def test_a_lone_miss_is_decoded_on_the_event_loop_only_while_nobody_else_reads():
    archive = FakeArchive()
    archive.add("m", "a.bin", WEIGHTS)
    archive.add("m", "b.bin", WEIGHTS[::-1])

    async def main():
        ops = LmzOperations(archive)
        fa = (await ops.open((await resolve(ops, "m/a.bin")).st_ino, os.O_RDONLY)).fh
        fb = (await ops.open((await resolve(ops, "m/b.bin")).st_ino, os.O_RDONLY)).fh
        offered = lambda fh: ops._files[fh].reader.idle_offered      # noqa: E731

        assert await ops.read(fa, 8192, 4096) == WEIGHTS[8192:12288]
        assert offered(fa)                                  # the only reader: decoded here
        assert await ops.read(fa, 90_000, 4096) == WEIGHTS[90_000:94096]
        assert offered(fa)                                  # the same file again
        assert await ops.read(fb, 0, 4096) == WEIGHTS[::-1][:4096]
        assert not offered(fb)                              # a.bin was read just now: a thread
        ops._recent_reads[fa] -= 1.0                        # ... but not if that was a second ago
        assert await ops.read(fb, 4096, 4096) == WEIGHTS[::-1][4096:8192]
        assert offered(fb)
        assert await ops.read(fa, 0, 4096) == WEIGHTS[:4096]
        assert await ops.read(fa, 50_000, 4096) == WEIGHTS[50_000:54096]
        assert not offered(fa)          # b.bin was read just now, even though a.bin was read last
        ops._recent_reads[fa] -= 1.0    # from here on b.bin alone is read

        archive.stream_active = True                        # a sequential reader is being served
        assert await ops.read(fb, 20_000, 4096) == WEIGHTS[::-1][20_000:24096]
        assert not offered(fb)
        archive.stream_active = False

        holder = object()                                   # a read is waiting in a thread
        await ops._limiter.acquire_on_behalf_of(holder)
        assert await ops.read(fb, 40_000, 4096) == WEIGHTS[::-1][40_000:44096]
        assert not offered(fb)
        ops._limiter.release_on_behalf_of(holder)
        assert await ops.read(fb, 60_000, 4096) == WEIGHTS[::-1][60_000:64096]
        assert offered(fb)
        await ops.release(fa)
        await ops.release(fb)
    run(main)


@pytest.mark.allow_log_warnings
def test_a_catalog_that_becomes_unreadable_is_logged_once_in_one_line_and_the_old_tree_still_serves(caplog):
    from lmzfs.reader.api import StoreError
    archive = make_archive()

    async def main():
        ops = LmzOperations(archive)
        weights = await resolve(ops, "minilm/model.safetensors")

        def damaged():
            raise StoreError("catalog /s/catalog.sqlite is damaged: run lmz verify --repair (malformed)")
        archive.files = damaged
        archive.add("late", "x.bin", b"x")                  # a new generation, so the tree refreshes
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                await expect_errno(errno.ENOENT, ops.lookup(ROOT_INODE, b"late"))
        assert await read_all(ops, weights.st_ino, weights.st_size) == WEIGHTS
        return [r for r in caplog.records if r.levelno >= logging.ERROR]
    errors = run(main)
    assert [r.getMessage() for r in errors] == [
        "could not refresh the model list, serving the one it had: "
        "catalog /s/catalog.sqlite is damaged: run lmz verify --repair (malformed)"]
    assert all(r.exc_info is None for r in errors)
