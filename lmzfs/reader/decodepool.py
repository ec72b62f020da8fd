"""Chunk decoding in worker processes, for hosts where threads cannot use every core.

Decoding is numpy and zstd work behind Python glue; two threads on two cores barely beat one
because the glue holds the GIL, while two processes scale. A worker reads the payload itself
(through /proc/<daemon>/fd/<n>, so a pack that `lmz gc` already unlinked stays readable for as
long as the daemon holds it open), decodes it, checks it as chunkread.read_chunk does, and
writes the plain bytes into a buffer shared with the daemon (a memfd both map), which the daemon
copies out once: no pickling of chunk data, no pipe copies. A worker that dies is replaced and
the chunk retried once; a chunk larger than the shared buffer is decoded in the calling thread.

A worker says it is ready (its imports done) before it is given work, and the decoder waits for
that: a mount is ready only when its workers are, so its first reads do not share the CPUs with
interpreters still starting, and a worker that cannot start fails the mount with a clear error
instead of every read with EIO.
"""
from __future__ import annotations

import logging
import mmap
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Extent

log = logging.getLogger(__name__)

BUFFER_BYTES = 16 << 20     # per worker; only the pages a chunk touches are ever allocated
START_SECONDS = 60.0        # how long a worker may take to start (imports on a cold disk)
# Default workers per usable CPU: a worker idles while the daemon takes its result and sends the
# next request, so one per CPU leaves the CPUs idle. Measured on astra (2 CPUs, 3 alternating
# rounds): 4 workers read 373-431 MB/s for 1 reader and 370-414 for 8, 2 workers 327-364 and 295-399.
WORKERS_PER_CPU = 2


@dataclass(frozen=True)
class _Request:
    path: str             # /proc/<pid>/fd/<n> of the daemon's descriptor for the pack
    extent: Extent


def _worker_main(conn: Connection, buffer_fd: int) -> None:
    """The worker process's loop: one request in, one ("ok", size) or ("error", message) out."""
    from lmzfs.malloc import tune_malloc
    from lmzfs.store.chunkread import read_chunk

    tune_malloc()
    out = mmap.mmap(buffer_fd, BUFFER_BYTES)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        try:
            fd = os.open(req.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                plain = read_chunk(fd, req.extent)
            finally:
                os.close(fd)
        except OSError as exc:
            conn.send(("error", exc.strerror or str(exc)))
            continue
        out[:len(plain)] = plain
        conn.send(("ok", len(plain)))


_WORKER_START = ("import sys; from multiprocessing.connection import Connection; "
                 "from lmzfs.reader.decodepool import _worker_main; "
                 "_worker_main(Connection(int(sys.argv[1])), int(sys.argv[2]))")


class WorkerStartError(RuntimeError):
    """A decode worker process exited or stayed silent instead of starting."""


class _Worker:
    def __init__(self, index: int):
        # A plain subprocess rather than multiprocessing's spawn, which would re-run the daemon's
        # __main__ module in the worker.
        self.name = f"lmz-decode-{index}"
        self.buffer_fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        os.ftruncate(self.buffer_fd, BUFFER_BYTES)
        self.buffer = mmap.mmap(self.buffer_fd, BUFFER_BYTES)
        ours, theirs = socket.socketpair()
        # `-c` rather than `-m lmzfs.reader.decodepool`: the package imports this module first,
        # and runpy warns about running a module that is already imported
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_START, str(theirs.fileno()), str(self.buffer_fd)],
            pass_fds=(theirs.fileno(), self.buffer_fd), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        self._stopped = False

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the worker has started; WorkerStartError (and the worker stopped) if it
        exits first or takes longer than timeout (START_SECONDS; its own error is on stderr)."""
        timeout = START_SECONDS if timeout is None else timeout
        try:
            if self.conn.poll(timeout):
                message = self.conn.recv()
                if message == ("ready", self.process.pid):
                    return
                reason = f"sent {message!r} instead of its ready message"
            else:
                reason = f"did not start within {timeout:g} s"
                self.process.kill()
        except (EOFError, OSError):
            status = self.process.wait()
            reason = f"exited with status {status} while starting (its error is on stderr above)"
        self.stop()
        raise WorkerStartError(f"decode worker {self.name} {reason}")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.conn.send(None)
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()
        self.buffer.close()
        os.close(self.buffer_fd)


class ProcessDecoder:
    """A fixed set of worker processes; `decode` blocks the calling thread (not the GIL) until done."""

    def __init__(self, workers: int):
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.workers = max(1, workers)
        started = [_Worker(i) for i in range(self.workers)]     # they start side by side
        try:
            for w in started:
                w.wait_ready()
        except WorkerStartError:
            for w in started:
                w.stop()
            raise
        for w in started:
            self._enlist(w)

    def _add(self, index: int) -> None:
        w = _Worker(index)
        w.wait_ready()
        self._enlist(w)

    def _enlist(self, w: _Worker) -> None:
        with self._lock:
            self._all.append(w)
        self._idle.put(w)

    def decode(self, fd: int, extent: Extent) -> bytes:
        if extent.size > BUFFER_BYTES:
            from lmzfs.store.chunkread import read_chunk
            return read_chunk(fd, extent)
        for attempt in (1, 2):
            worker = self._take()
            try:
                worker.conn.send(_Request(f"/proc/{os.getpid()}/fd/{fd}", extent))
                status, value = worker.conn.recv()
            except (EOFError, OSError) as exc:
                log.error("decode worker %s died (%s); starting another", worker.name, exc or "no reply")
                self._replace(worker)
                if attempt == 2:
                    raise CorruptChunk(f"chunk {extent.chunk_id.hex()[:16]}: decode worker died twice") from None
                continue
            try:
                if status == "ok":
                    return worker.buffer[:value]
                raise CorruptChunk(value)
            finally:
                self._idle.put(worker)
        raise AssertionError("unreachable")

    def _take(self) -> _Worker:
        """An idle worker; CorruptChunk once the decoder is shut down or has none left (every
        replacement failed to start), rather than waiting for one forever."""
        while True:
            if self._closed:
                raise CorruptChunk("the decoder is shut down")
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                with self._lock:
                    if not self._all:
                        raise CorruptChunk("no decode worker is running (none could be restarted; see the log)") from None

    def _replace(self, worker: _Worker) -> None:
        with self._lock:
            index = self._all.index(worker)
            self._all.pop(index)
        try:
            worker.stop()
        except Exception:
            pass
        if not self._closed:
            try:
                self._add(index)
            except WorkerStartError as exc:
                log.error("%s; %d decode worker(s) left", exc, len(self._all))

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.stop()
