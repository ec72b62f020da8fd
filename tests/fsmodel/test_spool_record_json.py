"""A spool record's JSON is exactly what docs/format.md says: Python's json.dumps(..., sort_keys=True)
of its members, `inline` as base64, then `check`, the XXH3-64 of the JSON without it; whatever
shortcut SpoolRecord.to_json takes to write it, and whatever a user's path or model name holds."""
from __future__ import annotations

import base64
import json

import pytest
import xxhash

from lmzfs.fsmodel.spoolrecord import SpoolRecord
from lmzfs.store.catalog.fsrows import EntryMeta

NAMES = ['plain', 'quote " and backslash \\', '"inline": ""', 'caf\u00e9 \u2603', '"inline": "AAAA"}']


def _record(inline: bytes | None, name: str) -> SpoolRecord:
    return SpoolRecord(spool_id="0123456789abcdef0123456789abcdef", model=name, path=f"d/{name}", file_id=None,
                       base_sha256=None, base_len=0, size=len(inline) if inline is not None else 9,
                       ranges=[(0, len(inline) if inline is not None else 9)],
                       meta=EntryMeta("file", 0o644, 0, 0, 1, 2, 3), durable=False, boot_id="boot",
                       sums=[], inline=inline)


def _as_documented(record: SpoolRecord) -> bytes:
    raw = {
        "spool_id": record.spool_id, "model": record.model, "path": record.path, "file_id": record.file_id,
        "base_sha256": record.base_sha256, "base_len": record.base_len, "size": record.size,
        "ranges": [list(r) for r in record.ranges],
        "meta": {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "atime_ns": 1, "mtime_ns": 2, "ctime_ns": 3,
                 "target": None},
        "version": record.version, "durable": record.durable, "journal_entries": record.journal_entries,
        "boot_id": record.boot_id, "sums": [], "journal_generation": record.journal_generation,
        "inline": None if record.inline is None else base64.b64encode(record.inline).decode("ascii"),
    }
    body = json.dumps(raw, sort_keys=True)
    return json.dumps({**raw, "check": f"{xxhash.xxh3_64_intdigest(body.encode()):016x}"}, sort_keys=True).encode()


@pytest.mark.parametrize("size", [None, 0, 1, 2, 3, 57, 2048, 22528])
@pytest.mark.parametrize("name", NAMES)
def test_a_records_json_is_the_sorted_json_of_its_members_with_its_check(size, name):
    inline = None if size is None else bytes((i * 31 + 7) % 256 for i in range(size))
    record = _record(inline, name)
    data = record.to_json()
    assert json.loads(data) == json.loads(_as_documented(record))
    without = json.loads(data)
    check = without.pop("check")
    assert check == f"{xxhash.xxh3_64_intdigest(json.dumps(without, sort_keys=True).encode()):016x}"
    assert SpoolRecord.from_json(data, "test") == record
