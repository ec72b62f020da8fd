"""At start-up, a writable mount commits every spool record a previous mount left: what its
writes (a record and its journal, fsmodel/spool.py and journal.py) and fsyncs accepted.

A record written in this boot is replayed with every journal entry (the daemon ended, the machine
did not: the page cache held every byte); one of an earlier boot only as of its last fsync, and
one never fsync'd is set aside. A record whose id the catalog names (fs_spool_commits) was
committed before the mount ended: its files are removed, and then the id is forgotten.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from lmzfs.fsmodel.catalogsync import CatalogSync
from lmzfs.fsmodel.commit import Committer
from lmzfs.fsmodel.journal import JournalEntry
from lmzfs.fsmodel.spoolsums import BLOCK
from lmzfs.fsmodel.namespace import Namespace
from lmzfs.fsmodel.nodes import Node
from lmzfs.fsmodel.records import SpoolRecords
from lmzfs.fsmodel.spool import Spool, SpoolRecord, boot_id
from lmzfs.fsmodel.stored import StoredFiles
from lmzfs.store.catalog.fsrows import forget_spool_commits, spool_commits
from lmzfs.store.layout import StoreError
from lmzfs.store.lock import WriterLock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayedState:
    """The journal entries a mount applies after a spooled file's record, and the later whole
    ones it drops (their sums may still vouch for blocks they changed: spoolsums.settle)."""
    applied: list[JournalEntry]
    dropped: list[JournalEntry]


class Replay:
    def __init__(self, spool: Spool, sync: CatalogSync, ns: Namespace, stored: StoredFiles,
                 records: SpoolRecords, committer: Committer):
        self._spool, self._sync, self._ns, self._stored = spool, sync, ns, stored
        self._records, self._committer = records, committer

    def run(self) -> int:
        """Commit every spool record a previous mount left; how many were committed."""
        spool, ns = self._spool, self._ns
        records = spool.records()
        for path in spool.leftover_data():
            log.info("keeping %s: a spool file with no record to replay", path)
        with self._sync.lock:
            committed = spool_commits(self._sync.catalog.db)
        done = 0
        for record in records:
            if record.spool_id in committed:
                spool.remove(record.spool_id)         # committed before the mount ended
                continue
            replayed = self._replayed_state(record)
            if replayed is None:
                continue
            where = f"{record.model}/{record.path}"
            try:
                reopened = spool.reopen(record, replayed.applied, replayed.dropped)
            except (OSError, StoreError) as exc:
                log.error("%s: its spool %s is kept, not replayed: %s", where, record.spool_id, exc)
                continue
            try:
                node = self._node_for_record(record)
            except StoreError as exc:
                log.error("%s", exc)
                reopened.spool_file.release()
                continue
            spool_file, state = reopened.spool_file, reopened.state
            if reopened.bad_blocks:
                log.error("%s: the spool's data is damaged in %d block(s) from byte %d (their checksums do not "
                          "match): reads of them fail (EIO), and the file stays in the spool %s", where,
                          len(reopened.bad_blocks), reopened.bad_blocks[0] * BLOCK, record.spool_id)
            base = self._stored.reader(node.file_id)
            node.data = self._records.new_data(node, base, state.size, spool_file=spool_file,
                                               base_len=state.base_len if base is not None else 0)
            node.apply_meta(record.meta)
            if reopened.refold:        # a record of an older version: recorded again in this one, with sums
                try:
                    with node.data.lock:
                        self._records.compact(node, spool_file)
                except OSError as exc:
                    raise StoreError(f"{where}: its spool, left by an earlier version of lmzfs, could not be "
                                     f"recorded again in this one ({exc.strerror or exc}); it is kept as it was: "
                                     f"free some space and mount again") from None
            try:
                stored_now = not reopened.bad_blocks and self._committer.commit(node)
            except (OSError, StoreError) as exc:
                log.error("%s stays in the spool: %s", where, exc)
                stored_now = False
            if stored_now:
                done += 1
            elif node.data is not None and node.data.dirty and not reopened.bad_blocks:
                with node.data.lock:
                    self._records.note(node, spool_file)    # a record of this boot for what it holds
            with ns.lock:
                if node.opens == 0 and node.data is not None and not node.data.dirty:
                    ns.close_later(node)
            ns.close_deferred()
        # ids of records now gone: removed durably first, so no record can come back to meet no row
        with self._sync.lock:
            spool.sync_removals()
            gone = committed - spool.record_ids()
            if gone:
                with WriterLock(self._sync.store.lock), self._sync.catalog.transaction() as db:
                    forget_spool_commits(db, gone)
        return done

    def _replayed_state(self, record: SpoolRecord) -> ReplayedState | None:
        """Which journal entries a replay applies to the record and which it drops; None if
        nothing of it can be trusted (the record is set aside)."""
        journal = self._spool.read_journal(record)
        where = f"{record.model}/{record.path}"
        if record.boot_id and record.boot_id == boot_id():
            # the daemon ended, the machine did not: the page cache holds every byte and entry
            if journal.damage is not None:
                log.warning("%s: replaying %d journal entries; the rest cannot be trusted (%s)",
                            where, len(journal.entries), journal.damage)
            return ReplayedState(journal.entries, [])
        if not record.durable:
            aside = self._spool.set_aside(record.spool_id)
            log.error("%s: written without fsync before the machine restarted, so its bytes may not be on "
                      "disk; not replayed, kept as %s", where, aside)
            return None
        if journal.entries or journal.damage is not None:
            log.warning("%s: replaying it as of its last fsync; %d later journal entries are dropped (written "
                        "without fsync before the machine restarted)", where, len(journal.entries))
        return ReplayedState([], journal.entries)

    def _node_for_record(self, record: SpoolRecord) -> Node:
        ns = self._ns
        with ns.lock:
            if record.file_id is not None:
                for node in ns.inodes.values():
                    if node.file_id == record.file_id:
                        stored_sha = self._stored.sha256(record.file_id)
                        if stored_sha is not None and stored_sha == record.base_sha256:
                            return node
                        raise StoreError(f"spool record {record.spool_id} changes a version of {record.model}/"
                                         f"{record.path} that is no longer stored; it is kept in {self._spool.dir}")
            # a new file (or its stored version is gone): recreate it where the record puts it
            directory = ns.root
            parts = record.model.split("/") + record.path.split("/")
            for part in parts[:-1]:
                child = directory.children.get(part)
                if child is None:
                    child = ns.new_node("dir", part, directory)
                    directory.children[part] = child
                directory = child
            if ns.where(directory) is None:
                raise StoreError(f"spool record {record.spool_id}: model {record.model!r} is gone; it is kept "
                                 f"in {self._spool.dir}")
            node = directory.children.get(parts[-1])
            if node is None or node.kind != "file":
                node = ns.new_node("file", parts[-1], directory, record.meta)
                directory.children[parts[-1]] = node
            return node
