"""Is the catalog sound? What `lmz verify --repair`, `lmz doctor` and `lmz mount` ask first.

A catalog file checks clean when its SQLite header holds only values SQLite writes, SQLite's
integrity check passes, its tables and version marker
are there, every value has its column's type and, for a copy, its content digest is the one
recorded when it was written. The live catalog is then judged against its copies: the same
generation as a copy must mean the same content (a flipped byte inside a row shows only so); a
generation newer than every copy (a writer killed between its commit and its copy) is accepted
only if every chunk row names a record that is in its pack and every file's extents tile it.
In a version 3 catalog a chunk's reference (chunks.base) must be another chunk of the catalog of
the same size; a model with a chunk whose chain of references reaches a missing chunk is broken.
"""
from __future__ import annotations

import os
import sqlite3
import struct
from dataclasses import dataclass, field
from pathlib import Path

from lmzfs.store.catalog import READABLE_VERSIONS, catalog_error, is_damage, readonly_uri, tables_of
from lmzfs.store.catalog.db import header_problem
from lmzfs.store.catalog.copies import DIGEST_KEY, CatalogCopy, content_digest, list_copies
from lmzfs.store.catalog.chunksizes import sizes_problem
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.packs import PACK_HEADER, PACK_MAGIC, RECORD_HEADER, RECORD_MAGIC, ChunkLocation
from lmzfs.store.catalog.uri import READ_ERRORS

# Values whose SQLite type is not the column's: a flipped type byte inside a row.
_TYPE_CHECKS = (
    "SELECT COUNT(*) FROM models WHERE typeof(id) != 'integer' OR typeof(name) != 'text' "
    "OR typeof(added) NOT IN ('real', 'integer') OR typeof(source) != 'text'",
    "SELECT COUNT(*) FROM files WHERE typeof(id) != 'integer' OR typeof(model) != 'integer' OR typeof(path) != 'text' "
    "OR typeof(size) != 'integer' OR typeof(mtime) NOT IN ('real', 'integer') OR typeof(sha256) != 'text' "
    "OR typeof(format) != 'text'",
    "SELECT COUNT(*) FROM chunks WHERE typeof(id) != 'blob' OR length(id) != 32 OR typeof(size) != 'integer' "
    "OR typeof(codec) != 'text' OR typeof(pack) != 'integer' OR typeof(offset) != 'integer' "
    "OR typeof(length) != 'integer' OR typeof(refs) != 'integer'",
    "SELECT COUNT(*) FROM extents WHERE typeof(file) != 'integer' OR typeof(seq) != 'integer' "
    "OR typeof(offset) != 'integer' OR typeof(chunk) != 'blob'",
    "SELECT COUNT(*) FROM meta WHERE typeof(key) != 'text' OR typeof(value) != 'text'",
)
# Version 3: references are chunk ids of chunks of the same size, never the chunk itself; tensors are typed.
_V3_CHECKS = (
    ("a chunk's reference is not a chunk id",
     "SELECT COUNT(*) FROM chunks WHERE base IS NOT NULL AND (typeof(base) != 'blob' OR length(base) != 32 "
     "OR base = id)"),
    ("a chunk's reference is not in the catalog, or is of another size",
     "SELECT COUNT(*) FROM chunks c LEFT JOIN chunks b ON b.id = c.base "
     "WHERE c.base IS NOT NULL AND (b.id IS NULL OR b.size != c.size)"),
    ("a row holds a value of the wrong type",
     "SELECT COUNT(*) FROM tensors WHERE typeof(file) != 'integer' OR typeof(name) != 'text' "
     "OR typeof(dtype) != 'text' OR typeof(shape) != 'text' OR typeof(offset) != 'integer' "
     "OR typeof(size) != 'integer'"),
)


@dataclass(frozen=True)
class FileCheck:
    """One catalog file (the live one or a copy), examined read-only."""
    path: Path
    problem: str | None          # None: it checks clean; else one line
    generation: int = 0
    digest: str | None = None
    unreadable: bool = False     # it could not be read now (I/O error, full disk): not judged damaged

    def __post_init__(self) -> None:
        if self.problem is not None:
            object.__setattr__(self, "problem", " ".join(self.problem.split()))

    @property
    def clean(self) -> bool:
        return self.problem is None


@dataclass
class PackIndex:
    """Every record found by walking the packs: chunk id -> where its payloads lie."""
    records: dict[bytes, list[ChunkLocation]] = field(default_factory=dict)
    packs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PackAgreement:
    """How a catalog's chunk rows and extents agree with the packs on disk."""
    relocated: dict[bytes, ChunkLocation]    # chunk -> where its record now lies (moved by a gc since)
    missing: set[bytes]                      # chunks no pack holds
    broken_models: set[str]                  # models with a missing chunk, or extents that do not tile a file

    @property
    def agrees(self) -> bool:
        return not (self.relocated or self.missing or self.broken_models)


@dataclass(frozen=True)
class Verdict:
    live: FileCheck
    problem: str | None          # None: the live catalog is sound
    copies: list[tuple[CatalogCopy, FileCheck]]

    @property
    def sound(self) -> bool:
        return self.problem is None


def examine(path: Path, *, copy: bool = False) -> FileCheck:
    if not path.exists():
        return FileCheck(path, "it is missing")
    try:
        problem = header_problem(path)
    except OSError as exc:
        return FileCheck(path, f"its header cannot be read ({exc.strerror})", unreadable=True)
    if problem:
        return FileCheck(path, problem)
    try:
        db = sqlite3.connect(readonly_uri(path), uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        return _failed(path, exc)
    try:
        db.execute("BEGIN")         # one snapshot for every check below
        rows = [r[0] for r in db.execute("PRAGMA integrity_check(20)")]
        if rows != ["ok"]:
            return FileCheck(path, f"integrity_check: {rows[0]}")
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        common = tables_of(None)
        if not common <= tables:
            return FileCheck(path, f"tables {', '.join(sorted(common - tables))} are missing")
        meta = dict(db.execute("SELECT key, value FROM meta"))
        version = meta.get("catalog_version")
        if version not in READABLE_VERSIONS:
            return FileCheck(path, f"the version marker reads {version!r}")
        if not tables_of(version) <= tables:
            return FileCheck(path, f"tables {', '.join(sorted(tables_of(version) - tables))} are missing")
        columns = {r[1] for r in db.execute("PRAGMA table_info(chunks)")}
        has_xxh3 = "xxh3" in columns
        if has_xxh3 != (version != "1"):
            return FileCheck(path, f"version {version} {'has' if has_xxh3 else 'lacks'} the chunks.xxh3 column")
        if ("base" in columns) != (version == "3"):
            return FileCheck(path, f"version {version} {'has' if 'base' in columns else 'lacks'} "
                                   f"the chunks.base column")
        if version == "3":
            for problem, query in _V3_CHECKS:
                if db.execute(query).fetchone()[0]:
                    return FileCheck(path, problem)
        if has_xxh3 and db.execute("SELECT COUNT(*) FROM chunks WHERE xxh3 IS NOT NULL AND "
                                   "(typeof(xxh3) != 'blob' OR length(xxh3) != 16)").fetchone()[0]:
            return FileCheck(path, "a chunk's read checksum is not 16 bytes")
        for query in _TYPE_CHECKS:
            if db.execute(query).fetchone()[0]:
                return FileCheck(path, "a row holds a value of the wrong type")
        generation = meta.get("generation", "0")
        if not generation.isdigit():
            return FileCheck(path, f"the generation marker reads {generation!r}")
        problem = sizes_problem(meta)
        if problem is not None:
            return FileCheck(path, problem)
        digest = content_digest(db)
        if copy and meta.get(DIGEST_KEY) != digest:
            return FileCheck(path, "its content differs from the digest recorded when it was written")
        return FileCheck(path, None, int(generation), digest)
    except sqlite3.Error as exc:
        return _failed(path, exc)
    except UnicodeDecodeError as exc:           # text SQLite hands back (the schema's, a row's) damaged
        return FileCheck(path, f"it holds text that is not UTF-8 ({exc.reason})")
    finally:
        db.close()


def _failed(path: Path, exc: sqlite3.Error) -> FileCheck:
    """Damage, or a file that cannot be read now (a full disk, an I/O error): not judged."""
    if is_damage(exc):
        return FileCheck(path, str(exc))
    return FileCheck(path, str(catalog_error(path, exc)), unreadable=True)


def index_packs(store: StorePaths) -> PackIndex:
    """Walk every pack's records from its header (one read per record header); a walk stops at
    the first bytes that are not a whole record (the tail of an add that never committed)."""
    index = PackIndex()
    for p in sorted(store.packs.glob("pack-*.lmzp")):
        stem = p.name[len("pack-"):-len(".lmzp")]
        if len(stem) != 8 or not stem.isdigit():
            continue
        pack_id = int(stem)
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            head = os.pread(fd, len(PACK_HEADER), 0)
            if head[:8] != PACK_MAGIC:
                continue
            index.packs.append(pack_id)
            size = os.fstat(fd).st_size
            pos = len(PACK_HEADER)
            while pos + RECORD_HEADER.size <= size:
                try:
                    magic, cid, length = RECORD_HEADER.unpack(os.pread(fd, RECORD_HEADER.size, pos))
                except struct.error:
                    break
                if magic != RECORD_MAGIC or pos + RECORD_HEADER.size + length > size:
                    break
                index.records.setdefault(cid, []).append(ChunkLocation(pack_id, pos + RECORD_HEADER.size, length))
                pos += RECORD_HEADER.size + length
        finally:
            os.close(fd)
    return index


def agreement(db: sqlite3.Connection, index: PackIndex) -> PackAgreement:
    """Check every chunk row against the packs and every file's extents against its size."""
    relocated: dict[bytes, ChunkLocation] = {}
    missing: set[bytes] = set()
    for cid, pack, offset, length in db.execute("SELECT id, pack, offset, length FROM chunks"):
        found = index.records.get(cid, [])
        if ChunkLocation(pack, offset, length) in found:
            continue
        same_length = [loc for loc in found if loc.length == length]
        if same_length:
            relocated[cid] = same_length[-1]
        else:
            missing.add(cid)
    return PackAgreement(relocated, missing, broken_models(db, missing))


def broken_models(db: sqlite3.Connection, missing: set[bytes]) -> set[str]:
    """The models with a file that needs one of these chunks (directly or down a chain of
    references), or whose extents do not tile it."""
    sizes = dict(db.execute("SELECT id, size FROM chunks"))
    missing_below = _reaching(db, missing)
    broken: set[str] = set()
    files = {fid: (model, size) for fid, model, size in db.execute(
        "SELECT f.id, m.name, f.size FROM files f JOIN models m ON m.id = f.model")}
    ends: dict[int, int] = {}
    for fid, seq, offset, chunk in db.execute("SELECT file, seq, offset, chunk FROM extents ORDER BY file, seq"):
        model = files.get(fid, (None, 0))[0]
        if model is None:
            continue
        if chunk in missing or chunk in missing_below or chunk not in sizes or offset != ends.get(fid, 0):
            broken.add(model)
            ends[fid] = -1
            continue
        if ends.get(fid, 0) >= 0:
            ends[fid] = offset + sizes[chunk]
    for fid, (model, size) in files.items():
        if ends.get(fid, 0) != size:
            broken.add(model)
    orphans = db.execute("SELECT COUNT(*) FROM files WHERE model NOT IN (SELECT id FROM models)").fetchone()[0]
    if orphans:
        broken.add("(files of no model)")
    return broken


def _reaching(db: sqlite3.Connection, missing: set[bytes]) -> set[bytes]:
    """The chunks whose chain of references reaches one of these (none in a catalog before version 3)."""
    if not missing or "base" not in {r[1] for r in db.execute("PRAGMA table_info(chunks)")}:
        return set()
    dependants: dict[bytes, list[bytes]] = {}
    for cid, base in db.execute("SELECT id, base FROM chunks WHERE base IS NOT NULL"):
        dependants.setdefault(base, []).append(cid)
    out: set[bytes] = set()
    todo = list(missing)
    while todo:
        for d in dependants.get(todo.pop(), ()):
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


def diagnose(store: StorePaths, *, check_packs: bool = True) -> Verdict:
    """Judge the live catalog against its copies (and, where no copy can, against the packs).
    StoreError if the live catalog cannot be read now (a full disk, an I/O error): that judges
    nothing, and nothing may act on it as if it were damaged."""
    live = examine(store.catalog)
    if live.unreadable:
        raise StoreError(f"{live.problem}; it is not judged damaged")
    copies = [(c, examine(c.path, copy=True)) for c in list_copies(store.catalog)]
    if not live.clean:
        return Verdict(live, live.problem, copies)
    for c, check in copies:
        if check.clean and check.generation == live.generation:
            if check.digest == live.digest:
                return Verdict(live, None, copies)
            return Verdict(live, f"its content differs from its copy {c.path.name} of the same generation", copies)
    newest = max((check.generation for _, check in copies if check.clean), default=-1)
    if live.generation < newest:
        return Verdict(live, f"its generation {live.generation} is older than its copy's {newest}", copies)
    if check_packs:
        db = sqlite3.connect(readonly_uri(store.catalog), uri=True, isolation_level=None)
        try:
            agree = agreement(db, index_packs(store))
        except READ_ERRORS as exc:
            return Verdict(live, str(exc), copies)
        finally:
            db.close()
        if not agree.agrees:
            return Verdict(live, f"it disagrees with the packs ({len(agree.missing)} chunk(s) missing, "
                                 f"{len(agree.relocated)} elsewhere, {len(agree.broken_models)} model(s) broken)",
                           copies)
    return Verdict(live, None, copies)
