#!/usr/bin/env python3
"""What keeping catalog copies costs each write, on catalogs of stores with many models.

    .venv/bin/python bench/catalog_copy_cost.py [--models 100,1000] [--files 10] [--extents 100] [--runs 3]

For each size it builds a catalog of MODELS models of FILES files of EXTENTS extents each, every
extent its own chunk (no deduplication: the most rows per model byte), then times what a write
adds: before it, the writer's check of the catalog (PRAGMA quick_check and the content digest
compared with its copy); after its commit, writing the copy (backup API, digest, fsync, rename).
Prints one JSON line per size: catalog bytes and median seconds of each step over RUNS runs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(path: Path, models: int, files: int, extents: int) -> None:
    from lmzfs.store.catalog import Catalog
    catalog = Catalog(path)
    try:
        with catalog.transaction() as db:
            for m in range(models):
                mid = db.execute("INSERT INTO models (name, added, source) VALUES (?,?,?)",
                                 (f"family/model-{m:05d}", 1.7e9 + m, f"/models/model-{m:05d}")).lastrowid
                for f in range(files):
                    fid = db.execute("INSERT INTO files (model, path, size, mtime, sha256, format) VALUES (?,?,?,?,?,?)",
                                     (mid, f"model-{f:05d}-of-{files:05d}.safetensors", extents << 20, 1.7e9,
                                      hashlib.sha256(b"%d/%d" % (m, f)).hexdigest(), "safetensors")).lastrowid
                    rows = []
                    for e in range(extents):
                        cid = hashlib.sha256(b"%d/%d/%d" % (m, f, e)).digest()
                        rows.append((cid, fid, e))
                    db.executemany("INSERT INTO chunks (id, size, codec, pack, offset, length, refs, xxh3) "
                                   "VALUES (?, 1048576, 'floatsplit', 1, 16, 700000, 1, ?)",
                                   [(cid, cid[:16]) for cid, _, _ in rows])
                    db.executemany("INSERT INTO extents (file, seq, offset, chunk) VALUES (?, ?, ?, ?)",
                                   [(fid, e, e << 20, cid) for cid, fid, e in rows])
    finally:
        catalog.close()


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="100,1000")
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--extents", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    from lmzfs.store.catalog.copies import content_digest, list_copies, write_copy

    for models in (int(x) for x in args.models.split(",")):
        with tempfile.TemporaryDirectory(prefix="lmz-copy-cost-") as tmp:
            path = Path(tmp) / "catalog.sqlite"
            t_build = timed(lambda: build(path, models, args.files, args.extents))
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            check, copy = [], []
            for _ in range(args.runs):
                check.append(timed(lambda: (db.execute("PRAGMA quick_check").fetchall(), content_digest(db))))
                copy.append(timed(lambda: write_copy(db, path)))
            copy_bytes = list_copies(path)[0].path.stat().st_size
            db.close()
            print(json.dumps({
                "models": models, "files": models * args.files, "extents": models * args.files * args.extents,
                "catalog_bytes": os.path.getsize(path), "copy_bytes": copy_bytes,
                "build_s": round(t_build, 2),
                "writer_check_s": round(statistics.median(check), 3),
                "copy_s": round(statistics.median(copy), 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
