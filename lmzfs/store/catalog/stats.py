"""Counts over the catalog: what `lmz doctor` reports and what the rewrite passes measure.

Each function reads on the connection it is given (usually `catalog.db`) and lets SQLite's
errors through, for its caller to report.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogCounts:
    models: int
    files: int
    logical_bytes: int          # plain bytes of every file
    chunks: int
    unreferenced_chunks: int    # chunks nothing references: garbage until `lmz gc`
    unreferenced_bytes: int     # their payload bytes


def quick_check(db: sqlite3.Connection) -> list[str]:
    """SQLite's quick_check of the file: ["ok"], or its problems."""
    return [r[0] for r in db.execute("PRAGMA quick_check")]


def counts(db: sqlite3.Connection) -> CatalogCounts:
    one = lambda q: db.execute(q).fetchone()                                  # noqa: E731
    files, logical = one("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM files")
    unreferenced, unreferenced_bytes = one("SELECT COUNT(*), COALESCE(SUM(length), 0) FROM chunks WHERE refs = 0")
    return CatalogCounts(one("SELECT COUNT(*) FROM models")[0], files, logical, one("SELECT COUNT(*) FROM chunks")[0],
                         unreferenced, unreferenced_bytes)


def live_payload_bytes(db: sqlite3.Connection) -> int:
    """Payload bytes of the chunks something references (refs > 0)."""
    return db.execute("SELECT COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()[0]
