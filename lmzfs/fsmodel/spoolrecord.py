"""A spool record (STORE/spool/ID.json, fsmodel/spool.py): what a spooled file is, enough to
commit it after a crash; its JSON form, with a checksum of its own (docs/format.md).

Version 4 may hold a new small file's bytes itself (`inline`, base64): a file created in the
mount whose bytes stay within INLINE_MAX has no ID.data or ID.log, only its record, rewritten in
place at each write (spool.py); versions 1 to 3 (no `inline`) are read as they were written."""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import xxhash

from lmzfs.fsmodel.journal import FileState
from lmzfs.store.catalog.fsrows import EntryMeta
from lmzfs.store.layout import StoreError

RECORD_VERSION = 4
RECORD_VERSIONS = (1, 2, 3, 4)         # 1: written at fsync only, no journal (always durable); 1, 2: no sums;
                                       # 4: `inline` bytes
INLINE_MAX = 22 << 10                 # a new file's bytes kept in its record, at most (base64: a pair holds it)


@cache
def boot_id() -> str:
    """This boot of the machine: a record from another boot outlived a restart (and the page cache)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""                      # unknown: every unsynced record is then from "another boot"


@dataclass(frozen=True)
class SpoolRecord:
    """What a spooled file is: enough to commit it after a crash."""
    spool_id: str
    model: str
    path: str                          # inside the model, at the last fsync or rename
    file_id: int | None                # the stored file it changes (None: a new file)
    base_sha256: str | None            # that stored file's content the ranges apply to
    base_len: int                      # bytes of the stored file still visible (after truncates)
    size: int
    ranges: list[tuple[int, int]]      # where ID.data holds the file's bytes
    meta: EntryMeta
    version: int = RECORD_VERSION
    durable: bool = True               # written with its bytes fsync'd (else: page cache only)
    journal_entries: int = 0           # entries of ID.log already in `ranges`, `size`, `base_len`
    boot_id: str | None = None         # the boot it was written in
    sums: list[tuple[int, int]] | None = None   # (block, XXH3-64 of its held bytes) (spoolsums.py)
    journal_generation: int = 0        # the generation of ID.log whose entries follow it
    inline: bytes | None = None        # the file's bytes, held by the record itself (no ID.data, no ID.log)

    def to_json(self) -> bytes:
        # as dataclasses.asdict gives it (the fields are flat but for meta), without its deep copies
        raw = {f.name: getattr(self, f.name) for f in _RECORD_FIELDS}
        raw["meta"] = {f.name: getattr(self.meta, f.name) for f in _META_FIELDS}
        if self.version < 4:
            del raw["inline"]
        elif self.inline is not None:
            raw["inline"] = ""         # its base64 goes in below, past the encoder
        if self.version < 3:
            del raw["sums"], raw["journal_generation"]
            return json.dumps(raw, sort_keys=True).encode()
        body = json.dumps(raw, sort_keys=True).encode()
        if self.inline:
            # base64 is plain ASCII that JSON does not escape: the same bytes the encoder would
            # write, without it scanning up to 30 KB of them on every rewrite of the record. The
            # first `"inline": ""` is this member's: the keys before it name no string of a user's
            at = body.index(b'"inline": ""') + len(b'"inline": "')
            body = body[:at] + base64.b64encode(self.inline) + body[at:]
        # the check joins the object as its last member: one encoding, not two (readers do not
        # care where a member stands; from_json checks the JSON without it, keys sorted)
        return body[:-1] + b', "check": "%016x"}' % xxhash.xxh3_64_intdigest(body)

    def state(self) -> FileState:
        return FileState(self.size, self.base_len, self.ranges,
                         None if self.sums is None else dict(self.sums))

    @classmethod
    def from_json(cls, data: bytes, source: Path) -> "SpoolRecord":
        try:
            raw = json.loads(data)
            if raw.get("version") not in RECORD_VERSIONS:
                raise StoreError(f"spool record {source}: version {raw.get('version')!r} is not supported")
            if raw["version"] >= 3:
                check = raw.pop("check", None)
                body = json.dumps(raw, sort_keys=True).encode()
                if check != f"{xxhash.xxh3_64_intdigest(body):016x}":
                    raise ValueError("its checksum does not match")
                raw["sums"] = [(int(k), int(v)) for k, v in raw["sums"]]
            raw["meta"] = EntryMeta(**raw["meta"])
            raw["ranges"] = [tuple(r) for r in raw["ranges"]]
            if raw.get("inline") is not None:
                raw["inline"] = base64.b64decode(raw["inline"].encode("ascii"), validate=True)
            record = cls(**raw)
            if record.inline is not None and (len(record.inline) != record.size or record.version < 4):
                raise ValueError("its inline bytes are not the file's size")
            if record.version == 1 and not record.durable:
                raise ValueError("a version 1 record is durable")
            return record
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
            raise StoreError(f"spool record {source} is damaged ({exc}); it is kept, move it away to mount") from None


_RECORD_FIELDS = fields(SpoolRecord)
_META_FIELDS = fields(EntryMeta)


