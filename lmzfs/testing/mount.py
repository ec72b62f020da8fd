"""``mounted(...)``: a real lmzfs mount in a subprocess for the length of a ``with`` block.

It always unmounts on the way out, even when the block fails: ``fusermount3 -u``, then a lazy
``-uz`` if the mount is busy, then it kills the server; and it checks that nothing is left
mounted there. The server runs in its own process because a test that mmaps a served file from
the serving process could deadlock on the GIL.
"""
from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping

from lmzfs.daemon.mount import is_mount_point
from lmzfs.fsmodel.spool import pending_records

FAKE_ARCHIVE_FACTORY = "lmzfs.testing.fake_archive:open_saved"


@dataclass
class MountedFS:
    mountpoint: Path
    process: subprocess.Popen
    _log: IO[bytes]

    def log(self) -> str:
        """What the server wrote to stdout and stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")


def daemon_command(mountpoint: Path, store_dir: Path, *extra_args: str) -> list[str]:
    return [sys.executable, "-m", "lmzfs.daemon", "--foreground", "--store", str(store_dir),
            *extra_args, str(mountpoint)]


@contextmanager
def mounted(mountpoint: str | Path, store_dir: str | Path, *extra_args: str, fake=None,
            timeout: float = 30.0, env: Mapping[str, str] | None = None,
            open_files: int | None = None) -> Iterator[MountedFS]:
    """Serve *store_dir* at *mountpoint* until the block ends.

    With *fake* (a FakeArchive) the fake is saved under *store_dir* and served instead of a real
    store; save it again to change what the mount shows. *env*: variables set for the server on
    top of this process's environment (e.g. NOTIFY_SOCKET). *open_files*: the server's limit of
    open descriptors (soft and hard), as a shell's `ulimit -n` gives it.
    """
    mountpoint, store_dir = Path(mountpoint).absolute(), Path(store_dir).absolute()
    args = list(extra_args)
    if fake is not None:
        fake.save(store_dir)
        args += ["--archive-factory", FAKE_ARCHIVE_FACTORY]
    with tempfile.TemporaryFile() as log, open("/dev/null", "rb") as devnull:
        process = subprocess.Popen(daemon_command(mountpoint, store_dir, *args),
                                   stdin=devnull, stdout=log, stderr=log,
                                   env=None if env is None else {**os.environ, **env},
                                   preexec_fn=None if open_files is None else functools.partial(
                                       resource.setrlimit, resource.RLIMIT_NOFILE, (open_files, open_files)))
        fs = MountedFS(mountpoint, process, log)
        try:
            _wait_until_mounted(fs, timeout)
            yield fs
        finally:
            unmount_and_stop(mountpoint, process)
            if is_mount_point(mountpoint):
                raise AssertionError(f"{mountpoint} is still mounted after the test\n{fs.log()}")


def _wait_until_mounted(fs: MountedFS, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not is_mount_point(fs.mountpoint):
        if fs.process.poll() is not None:
            raise AssertionError(f"lmzfs server exited with status {fs.process.returncode} before "
                                 f"mounting {fs.mountpoint}:\n{fs.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{fs.mountpoint} not mounted after {timeout:.0f}s:\n{fs.log()}")
        time.sleep(0.05)


def unmount_and_stop(mountpoint: Path, process: subprocess.Popen | None = None) -> None:
    """Unmount *mountpoint* however it takes, then make sure *process* is gone."""
    detached = False
    if is_mount_point(mountpoint):
        result = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
        if result.returncode != 0 and is_mount_point(mountpoint):
            # Busy: detach it now. The server would keep serving the open files until they are
            # closed, so it is told to stop as well.
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
            detached = True
    if process is not None:
        if detached and process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(done: Callable[[], bool], timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll `done` until it is true; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f}s")
        time.sleep(0.02)


def wait_committed(store_dir: str | Path, timeout: float = 30.0) -> None:
    """Wait until a writable mount of the store has committed every file written to it: its spool
    holds no record (each is removed once its file's commit is durable). A file's last close
    returns before its commit (the release that commits runs after close(2) returned)."""
    wait_for(lambda: not pending_records(Path(store_dir)), timeout, f"every commit of {store_dir}")
