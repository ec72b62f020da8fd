"""What a remote store holds, and how each object is encoded (docs/format.md, "Remote stores").

    PREFIX/CURRENT                                   the pointer: names the current snapshot
    PREFIX/snapshots/GGGGGGGGGGGG-TOKEN.lmzs        a catalog snapshot (generation G), immutable
    PREFIX/packs/NNNNNNNN-TOKEN.lmzp                a pack (same format as a local pack), immutable
    PREFIX/packs/NNNNNNNN-TOKEN.idx                 its record index, written once the pack is whole

Every object but CURRENT is written once, with a create-only PUT, and never changed; TOKEN is
random, so two pushes never write the same key. A pack's id (NNNNNNNN) is the number the
snapshot's catalog names it by; ids are handed out from the snapshot's `next_pack` and above any
id already in the bucket, so an id never names two packs in snapshots a host could hold at once.
Readers reject a version they do not know.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import struct
import time
from dataclasses import dataclass, field

from lmzfs.store.remote.objects import RemoteError

POINTER_KEY = "CURRENT"
POINTER_FORMAT = "lmzfs-remote"
POINTER_VERSION = 1
SNAPSHOT_MAGIC = b"LMZSNAP\x00"
SNAPSHOT_VERSION = 1
SNAPSHOT_HEAD = struct.Struct("<8sII")            # magic, version, manifest length
INDEX_MAGIC = b"LMZPIDX\x00"
INDEX_VERSION = 1
INDEX_HEAD = struct.Struct("<8sIIQ32s")           # magic, version, records, pack size, SHA-256 of the records
INDEX_RECORD = struct.Struct("<32sQI32s16s")      # chunk id, payload offset, payload length, base id, codec
MAX_MANIFEST_BYTES = 64 << 20

_PACK_KEY = re.compile(r"packs/(\d{8})-([0-9a-f]{16})\.(lmzp|idx)$")
_SNAPSHOT_KEY = re.compile(r"snapshots/(\d{12})-([0-9a-f]{16})\.lmzs$")


class RemoteFormatError(RemoteError):
    """An object of the remote store is damaged, foreign, or of a version this lmzfs does not know."""


def new_token() -> str:
    return secrets.token_hex(8)


def pack_key(pack_id: int, token: str) -> str:
    return f"packs/{pack_id:08d}-{token}.lmzp"


def index_key(pack_key_: str) -> str:
    return pack_key_[:-len(".lmzp")] + ".idx"


def parse_pack_key(key: str) -> tuple[int, str, str] | None:
    """(pack id, token, "lmzp" or "idx") of a key under packs/, or None for anything else."""
    m = _PACK_KEY.fullmatch(key)
    return (int(m.group(1)), m.group(2), m.group(3)) if m else None


def snapshot_key(generation: int, token: str) -> str:
    return f"snapshots/{generation:012d}-{token}.lmzs"


def parse_snapshot_key(key: str) -> int | None:
    m = _SNAPSHOT_KEY.fullmatch(key)
    return int(m.group(1)) if m else None


# -- the pointer --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pointer:
    generation: int
    snapshot: str        # key of the snapshot object
    sha256: str          # of the whole snapshot object
    size: int
    written: float

    def encode(self) -> bytes:
        return json.dumps({"format": POINTER_FORMAT, "version": POINTER_VERSION, "generation": self.generation,
                           "snapshot": self.snapshot, "sha256": self.sha256, "size": self.size,
                           "written": self.written}, indent=1).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes, where: str) -> "Pointer":
        try:
            d = json.loads(raw)
            if d.get("format") != POINTER_FORMAT:
                raise RemoteFormatError(f"{where}: not an lmzfs remote store pointer")
            if d.get("version") != POINTER_VERSION:
                raise RemoteFormatError(f"{where}: pointer version {d.get('version')!r} is not supported "
                                        f"(this lmzfs reads {POINTER_VERSION}): upgrade lmzfs")
            p = cls(int(d["generation"]), str(d["snapshot"]), str(d["sha256"]), int(d["size"]), float(d["written"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemoteFormatError(f"{where}: the pointer is damaged ({exc.__class__.__name__})") from None
        if parse_snapshot_key(p.snapshot) != p.generation:
            raise RemoteFormatError(f"{where}: the pointer names {p.snapshot!r}, not a snapshot of generation "
                                    f"{p.generation}")
        return p


# -- snapshots ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RemotePack:
    key: str
    size: int


@dataclass
class Manifest:
    generation: int
    created: float
    next_pack: int
    packs: dict[int, RemotePack] = field(default_factory=dict)
    catalog_sha256: str = ""
    catalog_bytes: int = 0
    parent: str | None = None           # key of the snapshot this one was pushed over

    def to_json(self) -> bytes:
        return json.dumps({"generation": self.generation, "created": self.created, "next_pack": self.next_pack,
                           "parent": self.parent, "catalog_sha256": self.catalog_sha256,
                           "catalog_bytes": self.catalog_bytes,
                           "packs": {str(k): {"key": p.key, "size": p.size} for k, p in sorted(self.packs.items())}},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "Manifest":
        try:
            d = json.loads(raw)
            packs = {int(k): RemotePack(str(v["key"]), int(v["size"])) for k, v in d["packs"].items()}
            m = cls(int(d["generation"]), float(d["created"]), int(d["next_pack"]), packs,
                    str(d["catalog_sha256"]), int(d["catalog_bytes"]), d.get("parent"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemoteFormatError(f"{where}: the snapshot's manifest is damaged ({exc.__class__.__name__})") from None
        for pid, p in m.packs.items():
            parsed = parse_pack_key(p.key)
            if parsed is None or parsed[0] != pid or parsed[2] != "lmzp":
                raise RemoteFormatError(f"{where}: the manifest names {p.key!r} as pack {pid}")
        return m


def encode_snapshot(manifest: Manifest, catalog: bytes) -> bytes:
    """The snapshot object: header, manifest (JSON), then the catalog (SQLite) as one zstd frame."""
    import zstandard
    manifest.catalog_sha256 = hashlib.sha256(catalog).hexdigest()
    manifest.catalog_bytes = len(catalog)
    body = manifest.to_json()
    return SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, len(body)) + body + \
        zstandard.ZstdCompressor(level=9).compress(catalog)


def snapshot_manifest(head: bytes, where: str) -> tuple[Manifest, int]:
    """(the manifest, where the catalog starts) from the first bytes of a snapshot object
    (SNAPSHOT_HEAD.size + the manifest at least); RemoteFormatError if it is not one."""
    if len(head) < SNAPSHOT_HEAD.size:
        raise RemoteFormatError(f"{where}: not a snapshot (cut short)")
    magic, version, n = SNAPSHOT_HEAD.unpack_from(head)
    if magic != SNAPSHOT_MAGIC:
        raise RemoteFormatError(f"{where}: not an lmzfs catalog snapshot")
    if version != SNAPSHOT_VERSION:
        raise RemoteFormatError(f"{where}: snapshot version {version} is not supported (this lmzfs reads "
                                f"{SNAPSHOT_VERSION}): upgrade lmzfs")
    if n > MAX_MANIFEST_BYTES or len(head) < SNAPSHOT_HEAD.size + n:
        raise RemoteFormatError(f"{where}: the snapshot's manifest is cut short")
    return Manifest.from_json(head[SNAPSHOT_HEAD.size:SNAPSHOT_HEAD.size + n], where), SNAPSHOT_HEAD.size + n


def decode_snapshot(raw: bytes, where: str) -> tuple[Manifest, bytes]:
    """(manifest, catalog bytes), each checked: the catalog against the manifest's SHA-256."""
    import zstandard
    manifest, start = snapshot_manifest(raw, where)
    try:
        catalog = zstandard.ZstdDecompressor().decompress(raw[start:], max_output_size=manifest.catalog_bytes)
    except zstandard.ZstdError:
        raise RemoteFormatError(f"{where}: the snapshot's catalog is damaged") from None
    if len(catalog) != manifest.catalog_bytes or hashlib.sha256(catalog).hexdigest() != manifest.catalog_sha256:
        raise RemoteFormatError(f"{where}: the snapshot's catalog does not match its checksum")
    return manifest, catalog


# -- pack indexes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexedRecord:
    chunk_id: bytes
    offset: int          # of the payload in the pack object
    length: int
    codec: str = ""
    base: bytes | None = None


def encode_index(pack_size: int, records: list[IndexedRecord]) -> bytes:
    body = b"".join(INDEX_RECORD.pack(r.chunk_id, r.offset, r.length, r.base or bytes(32), r.codec.encode())
                    for r in records)
    return INDEX_HEAD.pack(INDEX_MAGIC, INDEX_VERSION, len(records), pack_size, hashlib.sha256(body).digest()) + body


def decode_index(raw: bytes, where: str) -> tuple[int, list[IndexedRecord]]:
    """(pack size, records); RemoteFormatError for anything but a whole index of this version."""
    if len(raw) < INDEX_HEAD.size:
        raise RemoteFormatError(f"{where}: not a pack index (cut short)")
    magic, version, count, pack_size, digest = INDEX_HEAD.unpack_from(raw)
    if magic != INDEX_MAGIC or version != INDEX_VERSION:
        raise RemoteFormatError(f"{where}: not a pack index of version {INDEX_VERSION}")
    body = raw[INDEX_HEAD.size:]
    if len(body) != count * INDEX_RECORD.size or hashlib.sha256(body).digest() != digest:
        raise RemoteFormatError(f"{where}: the pack index is damaged")
    out = []
    for i in range(count):
        cid, offset, length, base, codec = INDEX_RECORD.unpack_from(body, i * INDEX_RECORD.size)
        out.append(IndexedRecord(cid, offset, length, codec.rstrip(b"\0").decode("ascii", "replace"),
                                 None if base == bytes(32) else base))
    return pack_size, out


def now() -> float:
    return time.time()
