"""The spool records of a writable mount's files (fsmodel/spool.py): which file a spool file's
bytes belong to, so that a replay finds them a home.

A file's record is written (without fsync) when it gets its spool file, and again when its name
or metadata changes; fsync writes it durably, its bytes first. A file in no model, or unlinked,
gets none: no replay may bring it back.
"""
from __future__ import annotations

from lmzfs.fsmodel.filedata import FileData
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import Node
from lmzfs.fsmodel.nowait import holding
from lmzfs.fsmodel.spool import Spool, SpoolFile, SpoolRecord
from lmzfs.fsmodel.stored import StoredFiles


class SpoolRecords:
    def __init__(self, spool: Spool, ns: Namespace, stored: StoredFiles):
        self._spool = spool
        self._ns = ns
        self._stored = stored

    def new_data(self, node: Node, base, size: int, **kw) -> FileData:
        """FileData for the node, whose spool file (when it gets one) is recorded as the node's."""
        return FileData(self._spool, base, size, on_new_spool_file=lambda spool_file: self.note(node, spool_file),
                        on_long_journal=lambda spool_file: self.compact(node, spool_file), **kw)

    def _record_of(self, node: Node, spool_file: SpoolFile) -> SpoolRecord | None:
        """The node's spool record as it stands (None: it is in no model, or unlinked, so no replay
        may bring it back). Called with its data's lock held."""
        data = node.data
        # read without the namespace lock (a file's lock is never held while waiting for it): a
        # rename that races this records the file again once this returns (note_below)
        where = self._ns.where(node)
        meta = node.meta()
        if where is None or not node.linked:
            return None
        base_sha = self._stored.sha256(node.file_id) if node.file_id is not None else None
        return SpoolRecord(spool_file.spool_id, where[0], where[1], node.file_id, base_sha,
                           data.base_len, data.size, data.ranges.as_list(), meta)

    def note(self, node: Node, spool_file: SpoolFile) -> None:
        """Write the node's spool record without fsync (durably once it was fsync'd)."""
        record = self._record_of(node, spool_file)
        if record is not None:
            spool_file.note(record)

    def compact(self, node: Node, spool_file: SpoolFile) -> None:
        """Fold the journal into a new record of the node (called with its data's lock held): a
        file kept open and busy keeps a journal of at most COMPACT_ENTRIES entries."""
        record = self._record_of(node, spool_file)
        if record is None and spool_file.recorded:
            return                     # its record is on its way out (unlinked): nothing replays it
        spool_file.compact(record)

    def record(self, node: Node) -> None:
        """Write the node's spool record durably (its bytes first): called with its data's lock held."""
        spool_file = node.data.ensure_spool_file()
        record = self._record_of(node, spool_file)
        if record is not None:
            spool_file.record(record)

    def note_again(self, node: Node, *, wait: bool = False) -> None:
        """The node's name or metadata changed: a record it has must say so (a replay applies it).
        Unless `wait`, on the event loop it raises WouldBlock when a commit holds the file."""
        data = node.data
        if data is not None and data.spool_file is not None:
            with (data.lock if wait else holding(data.lock)):
                if data.spool_file is not None:
                    self.note(node, data.spool_file)

    def note_below(self, node: Node) -> None:
        """Spool records of uncommitted files name their path: rewrite those a rename moved."""
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.kind == "file":
                self.note_again(n, wait=True)   # the rename is done: no WouldBlock now
