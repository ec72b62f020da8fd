"""When and what a writable mount commits: a file's bytes go to the store (fsmodel/storecommit.py, the
`lmz add` machinery) at the release of a handle it changed through and at its last release (never
while a close(2) waits), once it was left alone for a while (commit_idle), and at the end
(commit_all). One commit at a time, each encoding on a pool of threads sized by the CPUs this
process may use.

In the background (a mount: start_background()), a release or an idle file only queues its
commit: one committer thread takes what is queued once WINDOW_SECONDS passed since the first
(or BATCH_FILES are queued; at once when a file over SMALL_FILE is queued), of the files whose
name, mode, owner and times no call changed for SETTLE_SECONDS (the times, mode and name a
program such as rsync sets right after it closes a file are set before the commit holds it), and commits the
small files among them together, in one pack session and one catalog transaction (group
commit), the others one by one. A commit's spool files are removed after it lets go of the
store's lock. A queued file is
committed as it stands when its turn comes (writes made meanwhile ride along).

A commit costs what changed: for each large file it committed, the committer keeps the
version's chunks and the state of its whole-file SHA-256 at chunk ends (at most HASH_STATES of
them, for the HISTORY_FILES files committed last). The next commit of that file takes each
chunk that no write or truncate touched since without reading it, and resumes the hash at the
last state before the first changed byte: an append reads and encodes the file's last chunk and
what was appended; a write into the middle reads the bytes after it for the hash, and encodes
the chunks it touched. The first commit of a file after the mount started reads it whole.

Chunks are coded by COMMIT_POLICY: as `lmz add` codes them, but for zstd's slow level on text,
which costs a commit of a tree of text files (a source tree, rsync'd documents) several times
its other work for a few percent of its bytes; the mount tries it on those chunks once it is
idle (recodetext.py)."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

from lmzfs.chunker import ChunkSizes
from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import Node
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.hostresources import open_descriptors, open_files_limit, usable_cpus
from lmzfs.fsmodel.storecommit import (CommittedFile, FileContent, FileToCommit, commit_file, commit_files,
                                      pre_encode_files)
from lmzfs.store.layout import StoreError
from lmzfs.store.write.encodefile import Unchanged
from lmzfs.store.write.policy import COMMIT_POLICY, EncodePolicy

log = logging.getLogger(__name__)

WINDOW_SECONDS = 0.1            # a queued commit waits at most this long for others to join it
BATCH_FILES = 256               # files one group commit takes at most
CODED_AHEAD_MAX = 32 << 20      # a new file up to this size is coded before its commit takes the lock
GROUP_FILES = 16                # ... and commits in parts of at most this many files
GROUP_BYTES = 4 << 20           # ... or bytes, each under one hold of the store's lock
SMALL_FILE = 256 << 10          # files up to this size are committed in groups
SETTLE_SECONDS = 0.03           # a queued file waits until no rename, chmod or utimes touched it for this long
SETTLE_LONGEST = 1.0            # ... or it was queued this long ago
QUIET_SECONDS = 0.05            # background commits wait for this lull in changes (writes, creates, renames ...)
DEFER_SECONDS = 10.0            # ... for this long at most
DEFER_FILES = 1024              # ... or until this many files are queued
DESCRIPTOR_SHARE = 4            # ... or the process holds 1/this of its descriptor limit (a spooled
                                # file not yet committed holds two)
HISTORY_FILES = 64              # the files whose last commit's chunks and hash states are kept
HASH_STATES = 512               # hash states kept per file at most


class Committer:
    def __init__(self, sync: CatalogSync, ns: Namespace, stored: StoredFiles, records: SpoolRecords, *,
                 workers: int | None, sizes: ChunkSizes):
        self._sync, self._ns, self._stored, self._records = sync, ns, stored, records
        self._sizes = sizes                 # what the store cuts files by (catalog/chunksizes.py)
        self._workers = workers or usable_cpus()
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="lmz-encode")
        self.commits = 0                    # how many commits this mount made (reclaim.py looks)
        self.appended = 0                   # and the payload bytes they appended
        self.after_commit: Callable[[], object] | None = None     # called by commit_or_log after one
        # given the chunks of each commit that zstd's slow level may make smaller (recodetext.py)
        self.on_text_chunks: Callable[[tuple[bytes, ...]], object] | None = None
        self._queue: dict[int, Node] = {}   # by inode, in the order queued
        self._queued_at: dict[int, float] = {}      # when each was queued (monotonic)
        self._first_queued = 0.0
        self._urgent = False                # a large file is queued: no window to wait for
        self._committing = 0                # files of the batch being committed in the background
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._spent: list = []              # spool files of committed versions, removed after the lock
        # file id -> (size, extents, hash states) of the versions committed last (larger files)
        self._history: OrderedDict[int, tuple[int, tuple, dict]] = OrderedDict()

    # -- one file --------------------------------------------------------------------------------
    def _what(self, node: Node):
        """(data, FileToCommit) of a node to commit now, or None; called with its data's lock held."""
        data = node.data
        if data is None or not data.dirty:
            return None
        with self._ns.lock:
            if not node.linked:
                return None
            where = self._ns.where(node)
            meta = node.meta()
            replaces = node.file_id
        if where is None:
            return None
        spool_id = data.spool_file.spool_id if data.spool_file is not None and data.spool_file.recorded \
            else None
        content = FileContent(data.as_file(), lambda length, offset: data.read(offset, length), data.size)
        return FileToCommit(where[0], where[1], content, meta, replaces, spool_id)

    def _done(self, node: Node, data, where: FileToCommit, done: CommittedFile) -> None:
        """A commit of the node is in the catalog: the node follows, its spool goes."""
        for warning in done.warnings:
            log.info("%s/%s: %s", where.model, where.path, warning)
        holes = self._stored.holes(done.file_id)
        with self._ns.lock:
            node.file_id = done.file_id
            node.size = done.size
            node.holes = holes
        # the record's id stays in fs_spool_commits until a mount finds the record gone (replay.py)
        if data.spool_file is not None and data.spool_file.durable:
            self._sync.wal.changed()        # an fsync'd record goes only once its commit is durable
            self._sync.sync()
        self._spent.append(data.rebase(self._stored.reader(node.file_id), done.size))
        if done.text_chunks and self.on_text_chunks is not None:
            self.on_text_chunks(done.text_chunks)
        self.commits += 1
        self.appended += done.new_payload_bytes

    def commit(self, node: Node) -> bool:
        """Store the node's bytes (if it has uncommitted ones); True if it committed."""
        data = node.data
        if data is None or not data.dirty:
            return False
        policy = self._coded_ahead(node, data)
        # The store lock before the file's: a removal holding the store lock may close the file's data.
        with self._removing_spent(), self._sync.changing(namespace=False), data.lock:
            if node.data is not data:
                return False
            what = self._what(node)
            if what is None:
                return False
            unchanged = self._unchanged(what.replaces, data)
            done = commit_file(self._sync.store, self._sync.catalog, self._pool, self._workers, model=what.model,
                               path=what.path, content=what.content, meta=what.meta, replaces=what.replaces,
                               spool_id=what.spool_id, sizes=self._sizes, unchanged=unchanged,
                               hash_every=max(self._sizes.other, data.size // HASH_STATES), policy=policy)
            self._remember(what.replaces, unchanged, done)
            self._done(node, data, what, done)
            return True

    def _coded_ahead(self, node: Node, data) -> EncodePolicy:
        """A new file's chunks coded before its commit takes the store's lock (while it holds
        none: namespace changes and other files' writes go on meanwhile), for a file of at most
        CODED_AHEAD_MAX; a file with a stored version is coded under the lock, as only what
        changed is coded at all."""
        if node.file_id is not None or data.size > CODED_AHEAD_MAX:
            return COMMIT_POLICY
        what = self._what_now(node)
        if what is None:
            return COMMIT_POLICY
        return pre_encode_files(self._pool, [what], self._sizes, COMMIT_POLICY)

    def _what_now(self, node: Node) -> FileToCommit | None:
        """_what() of the node as it stands, its data's lock taken for it (a coding ahead)."""
        data = node.data
        if data is None:
            return None
        with data.lock:
            return self._what(node) if node.data is data else None

    @contextmanager
    def _removing_spent(self) -> Iterator[None]:
        """Around a commit: the spool files it made redundant are removed once it let go of the
        store's lock and its files' (namespace changes need not wait for the unlinks)."""
        try:
            yield
        finally:
            spent, self._spent = self._spent, []
            for spool_file in spent:
                if spool_file is not None:
                    spool_file.close()

    def _unchanged(self, file_id: int | None, data) -> Unchanged | None:
        """What the file's previous version (if this mount committed it) lets its commit skip:
        the chunks no write or truncate touched since, and the hash state before the first
        changed byte. Called with the file's lock held."""
        kept = self._history.get(file_id) if file_id is not None else None
        if kept is None:
            return None
        size, extents, hashes = kept
        ranges = data.ranges
        written = ranges.as_list()
        first = min(data.base_len, written[0][0]) if written else data.base_len
        chunks = {}
        for i, (offset, cid) in enumerate(extents):
            end = extents[i + 1][0] if i + 1 < len(extents) else size
            if end <= data.base_len and not any(p.inside for p in ranges.pieces(offset, end)):
                chunks[offset] = (end - offset, cid)
        at = max((o for o in hashes if o <= first), default=0)
        return Unchanged(chunks, at, hashes.get(at))

    def _remember(self, old_id: int | None, unchanged: Unchanged | None, done: CommittedFile) -> None:
        old = self._history.pop(old_id, None) if old_id is not None else None
        if done.size <= SMALL_FILE or not done.hashes:
            return
        hashes = {o: h for o, h in old[2].items() if o <= unchanged.hashed} if old and unchanged else {}
        hashes.update(done.hashes)
        if len(hashes) > 2 * HASH_STATES:           # appends add one each: thin them out
            step, last, thinned = done.size // HASH_STATES, -done.size, {}
            for o in sorted(hashes):
                if o - last >= step or o == done.size:
                    thinned[o], last = hashes[o], o
            hashes = thinned
        self._history[done.file_id] = (done.size, done.extents, hashes)
        while len(self._history) > HISTORY_FILES:
            self._history.popitem(last=False)

    def commit_idle(self, idle_seconds: float) -> int:
        """Commit files unchanged for idle_seconds (in the background: queue them); how many."""
        now = time.monotonic()
        with self._ns.lock:
            nodes = [n for n in self._ns.inodes.values()
                     if n.uncommitted and now - n.data.last_change >= idle_seconds]
        if self._thread is not None:
            for node in nodes:
                self.commit_soon(node)
            return len(nodes)
        return sum(self.commit_or_log(node) for node in nodes)

    def commit_or_log(self, node: Node) -> bool:
        """commit(), for a caller no one waits on: a failure is logged (the bytes stay in the spool,
        and commit_idle tries again)."""
        try:
            done = self.commit(node)
        except (OSError, StoreError) as exc:
            log.error("committing %s: %s", "/".join(self._ns.path_parts(node)), exc)
            return False
        if done and self.after_commit is not None:
            self.after_commit()
        return done

    def commit_all(self, nodes: list[Node]) -> None:
        """At the end: what is uncommitted is committed, the small files together as in the
        background; what cannot be is recorded in the spool durably (the caller then makes the
        commits durable: the WAL's fsync)."""
        self.stop_background()
        pending = [node for node in nodes if node.uncommitted]
        self._commit_grouped(pending)
        for node in pending:
            if node.uncommitted:
                try:
                    with node.data.lock:
                        self._records.record(node)
                except (OSError, StoreError) as exc:
                    log.error("%s: its record in the spool is not durable: %s",
                              "/".join(self._ns.path_parts(node)), exc)

    # -- in the background -----------------------------------------------------------------------
    @property
    def background(self) -> bool:
        return self._thread is not None

    def start_background(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lmz-commit", daemon=True)
        self._thread.start()

    def commit_soon(self, node: Node) -> None:
        """Queue the node's commit (committed synchronously when there is no committer thread)."""
        if self._thread is None:
            self.commit_or_log(node)
            return
        with self._cv:
            if not self._queue:
                self._first_queued = time.monotonic()
            self._queue.setdefault(node.inode, node)
            self._queued_at.setdefault(node.inode, time.monotonic())
            data = node.data
            self._urgent = self._urgent or (data is not None and data.size > SMALL_FILE)
            self._cv.notify()

    def _take(self) -> list[Node] | None:
        with self._cv:
            while True:
                if self._stopping:
                    return None
                if self._queue:
                    wait = self._first_queued + WINDOW_SECONDS - time.monotonic()
                    if wait <= 0 or len(self._queue) >= BATCH_FILES or self._urgent:
                        taken = self._settled()
                        if taken:
                            break
                        wait = SETTLE_SECONDS
                    self._cv.wait(wait)
                else:
                    self._cv.wait()
            self._committing = len(taken)
            for node in taken:
                del self._queue[node.inode]
                self._queued_at.pop(node.inode, None)
            self._first_queued = time.monotonic()
            self._urgent = any(n.data is not None and n.data.size > SMALL_FILE for n in self._queue.values())
            return taken

    def _settled(self) -> list[Node]:
        """The queued files (BATCH_FILES at most) whose name, mode, owner and times no call changed
        for SETTLE_SECONDS (or that were queued SETTLE_LONGEST ago): a program that closes a file
        and then sets its times and mode and renames it (rsync, cp -p, tar) makes those calls
        before its commit holds the file. Writes meanwhile do not hold a commit back."""
        now_ns, now = time.time_ns(), time.monotonic()
        settled_ns = now_ns - int(SETTLE_SECONDS * 1e9)
        return [node for inode, node in self._queue.items()
                if node.renamed_or_set_ns <= settled_ns or self._queued_at.get(inode, now) + SETTLE_LONGEST <= now
                ][:BATCH_FILES]

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
            # a burst of changes (rsync, tar, cp -r, a build writing many files) goes first: its
            # files are in the spool meanwhile, as safe against a kill as a commit makes them,
            # and their commits' CPU would slow it down; then the files it queued meanwhile
            # are committed together
            self._sync.wait_quiet(QUIET_SECONDS, DEFER_SECONDS,
                                  until=lambda: self._stopping or len(self._queue) >= DEFER_FILES
                                  or open_descriptors() * DESCRIPTOR_SHARE >= open_files_limit())
            nodes = self._take()
            if nodes is None:
                return
            try:
                self._commit_batch(nodes)
            except Exception:                       # a bug must not stop every later commit
                log.exception("background commit")
            finally:
                with self._cv:
                    self._committing = 0

    def catching_up(self) -> bool:
        """Files are queued for a background commit or being committed: commits that will close
        their spool files (and free their descriptors)."""
        with self._cv:
            return bool(self._queue) or self._committing > 0

    def _commit_batch(self, nodes: list[Node]) -> None:
        self._commit_grouped(nodes)
        if self.after_commit is not None:
            self.after_commit()
        for node in nodes:
            self._let_go(node)

    def _commit_grouped(self, nodes: list[Node]) -> None:
        """Commit the nodes: the small files together (in parts), the others one by one; a
        failure is logged (what failed stays in the spool)."""
        small = [n for n in nodes if n.data is not None and n.data.size <= SMALL_FILE]
        if len(small) > 1:
            try:
                self._commit_together(small)
            except (OSError, StoreError) as exc:
                log.error("committing %d files together: %s; one by one instead", len(small), exc)
        for node in nodes:                          # what a group left out, and the large files
            if node.uncommitted:
                self._commit_quietly(node)

    def _commit_quietly(self, node: Node) -> bool:
        try:
            return self.commit(node)
        except (OSError, StoreError) as exc:
            log.error("committing %s: %s", "/".join(self._ns.path_parts(node)), exc)
            return False

    def _commit_together(self, nodes: list[Node]) -> None:
        # the chunks are coded first, holding no lock (namespace changes and writes go on
        # meanwhile); the commit under the store's lock looks them up (a file written since is
        # coded again there)
        ahead = [what for what in map(self._what_now, nodes) if what is not None]
        policy = pre_encode_files(self._pool, ahead, self._sizes, COMMIT_POLICY)
        # in parts, each a short hold of the store's lock: namespace changes waiting for it
        # (a directory's times set by rsync, a mkdir) go between the parts
        part, part_bytes = [], 0
        for node in nodes:
            data = node.data
            part.append(node)
            part_bytes += data.size if data is not None else 0
            if len(part) >= GROUP_FILES or part_bytes >= GROUP_BYTES:
                self._commit_part(part, policy)
                self._sync.let_changes_in()
                part, part_bytes = [], 0
        if part:
            self._commit_part(part, policy)

    def _commit_part(self, nodes: list[Node], policy) -> None:
        with self._removing_spent(), self._sync.changing(namespace=False), ExitStack() as held:
            picked = []
            for node in nodes:
                data = node.data
                if data is None:
                    continue
                held.enter_context(data.lock)
                what = self._what(node) if node.data is data else None
                if what is not None:
                    picked.append((node, data, what))
            if not picked:
                return
            done = commit_files(self._sync.store, self._sync.catalog, self._pool, self._workers,
                                [w for _, _, w in picked], self._sizes, policy)
            for (node, data, what), d in zip(picked, done):
                if d is not None:
                    self._done(node, data, what, d)

    def _let_go(self, node: Node) -> None:
        """After a background commit: the data of a file no one holds open goes."""
        with self._ns.lock:
            if node.opens == 0 and node.data is not None and not node.data.dirty:
                self._ns.close_later(node)
        self._ns.close_deferred()

    def stop_background(self) -> None:
        """Commit nothing more in the background (what is queued is the caller's: commit_all)."""
        thread = self._thread
        if thread is None:
            return
        with self._cv:
            self._stopping = True
            self._cv.notify()
        thread.join()
        self._thread = None
        self._queue.clear()
        self._queued_at.clear()

    def shutdown(self) -> None:
        self.stop_background()
        self._pool.shutdown(wait=True)
