"""When and what a writable mount commits: a file's bytes go to the store (fsmodel/storecommit.py, the
`lmz add` machinery) at the release of a handle it changed through and at its last release (never
while a close(2) waits), once it was left alone for a while (commit_idle), and at the end
(commit_all). One commit at a time, each encoding on a pool of threads sized by the CPUs this
process may use."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import Node
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.hostresources import usable_cpus
from lmzfs.fsmodel.storecommit import FileContent, commit_file
from lmzfs.store.layout import StoreError

log = logging.getLogger(__name__)


class Committer:
    def __init__(self, sync: CatalogSync, ns: Namespace, stored: StoredFiles, records: SpoolRecords, *,
                 workers: int | None, chunk_size: int):
        self._sync, self._ns, self._stored, self._records = sync, ns, stored, records
        self._chunk_size = chunk_size
        self._workers = workers or usable_cpus()
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="lmz-encode")
        self.commits = 0                    # how many commits this mount made (reclaim.py looks)
        self.appended = 0                   # and the payload bytes they appended
        self.after_commit: Callable[[], object] | None = None     # called by commit_or_log after one

    def commit(self, node: Node) -> bool:
        """Store the node's bytes (if it has uncommitted ones); True if it committed."""
        data = node.data
        if data is None or not data.dirty:
            return False
        # The store lock before the file's: a removal holding the store lock may close the file's data.
        with self._sync.changing(), data.lock:
            if not data.dirty or node.data is not data:
                return False
            with self._ns.lock:
                if not node.linked:
                    return False
                where = self._ns.where(node)
                meta = node.meta()
                replaces = node.file_id
            if where is None:
                return False
            spool_id = data.spool_file.spool_id if data.spool_file is not None and data.spool_file.recorded \
                else None
            content = FileContent(data.as_file(), lambda length, offset: data.read(offset, length), data.size)
            done = commit_file(self._sync.store, self._sync.catalog, self._pool, self._workers, model=where[0],
                               path=where[1], content=content, meta=meta, replaces=replaces,
                               spool_id=spool_id, chunk_size=self._chunk_size)
            for warning in done.warnings:
                log.info("%s/%s: %s", where[0], where[1], warning)
            holes = self._stored.holes(done.file_id)
            with self._ns.lock:
                node.file_id = done.file_id
                node.size = done.size
                node.holes = holes
            # the record's id stays in fs_spool_commits until a mount finds the record gone (replay.py)
            data.rebase(self._stored.reader(node.file_id), done.size)
            self.commits += 1
            self.appended += done.new_payload_bytes
            return True

    def commit_idle(self, idle_seconds: float) -> int:
        """Commit files unchanged for idle_seconds; how many were committed."""
        now = time.monotonic()
        with self._ns.lock:
            nodes = [n for n in self._ns.inodes.values()
                     if n.uncommitted and now - n.data.last_change >= idle_seconds]
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
        """At the end: what is uncommitted is committed (what cannot be is kept in the spool)."""
        for node in nodes:
            if node.uncommitted:
                try:
                    with node.data.lock:
                        self._records.record(node)      # durable first, whatever the commit does
                    self.commit(node)
                except (OSError, StoreError) as exc:
                    log.error("%s stays in the spool: %s", "/".join(self._ns.path_parts(node)), exc)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
