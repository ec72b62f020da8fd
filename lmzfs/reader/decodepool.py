"""Chunk decoding in worker processes, for hosts where threads cannot use every core.

Decoding is numpy and zstd work behind Python glue; two threads on two cores barely beat one
because the glue holds the GIL, while two processes scale. A worker reads the payload itself
(through /proc/<daemon>/fd/<n>, so a pack that `lmz gc` already unlinked stays readable for as
long as the daemon holds it open), decodes it, checks it as chunkread.read_chunk does, and
writes the plain bytes into a buffer shared with the daemon (a memfd both map), which the daemon
copies out once: no pickling of chunk data, no pipe copies. A worker that dies is replaced and
the chunk retried once; a chunk larger than the shared buffer is decoded in the calling thread.
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

    def stop(self) -> None:
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
        for i in range(self.workers):
            self._add(i)

    def _add(self, index: int) -> None:
        w = _Worker(index)
        with self._lock:
            self._all.append(w)
        self._idle.put(w)

    def decode(self, fd: int, extent: Extent) -> bytes:
        if extent.size > BUFFER_BYTES:
            from lmzfs.store.chunkread import read_chunk
            return read_chunk(fd, extent)
        for attempt in (1, 2):
            if self._closed:
                raise CorruptChunk("the decoder is shut down")
            worker = self._idle.get()
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

    def _replace(self, worker: _Worker) -> None:
        with self._lock:
            index = self._all.index(worker)
            self._all.pop(index)
        try:
            worker.stop()
        except Exception:
            pass
        if not self._closed:
            self._add(index)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.stop()
