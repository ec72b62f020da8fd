"""The chunk sizes a store cuts files by, recorded in its catalog's meta when the catalog is created
(docs/format.md, "Catalog"): `chunk_size` (every segment but float tensors) and
`float_chunk_size` (tensors of chunker.FLOAT_DTYPES), decimal bytes.

Every writer of the store (`lmz add`, a writable mount's commits, the Hugging Face import) cuts
by them unless told otherwise (`lmz add --chunk-size`), so that the same tensor makes the same
chunks in every model it is stored in. A catalog without them was created before stores recorded
their sizes and cut every segment at 1 MiB: it keeps doing so (LEGACY_SIZES), so that what it
already holds keeps deduplicating. A value that is not a size within the chunker's bounds is
damage, reported (the catalog's CatalogDamaged, `lmz verify`), never guessed around.
"""
from __future__ import annotations

import sqlite3

from lmzfs.chunker import LEGACY_SIZES, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, ChunkSizes

OTHER_KEY, FLOAT_KEY = "chunk_size", "float_chunk_size"


def record_statements(sizes: ChunkSizes) -> str:
    """SQL that records `sizes` in a new catalog's meta (inside its creating transaction)."""
    return (f"INSERT OR IGNORE INTO meta VALUES ('{OTHER_KEY}', '{int(sizes.other)}');\n"
            f"INSERT OR IGNORE INTO meta VALUES ('{FLOAT_KEY}', '{int(sizes.floats)}');\n")


def sizes_problem(meta: dict[str, str]) -> str | None:
    """What is wrong with the sizes recorded in `meta` (a catalog's key -> value), or None."""
    present = [k for k in (OTHER_KEY, FLOAT_KEY) if k in meta]
    if len(present) == 1:
        return f"meta has {present[0]} without {({OTHER_KEY, FLOAT_KEY} - set(present)).pop()}"
    for key in present:
        value = meta[key]
        if not (isinstance(value, str) and value.isascii() and value.isdigit()
                and MIN_CHUNK_SIZE <= int(value) <= MAX_CHUNK_SIZE):
            return f"meta's {key} reads {value!r}, not a chunk size of {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE} bytes"
    return None


def recorded_sizes(db: sqlite3.Connection) -> ChunkSizes:
    """The sizes the store cuts by: those recorded, else (a catalog created before they were)
    LEGACY_SIZES; ValueError naming what is wrong with recorded ones."""
    meta = dict(db.execute(f"SELECT key, value FROM meta WHERE key IN ('{OTHER_KEY}', '{FLOAT_KEY}')"))
    problem = sizes_problem(meta)
    if problem is not None:
        raise ValueError(problem)
    if not meta:
        return LEGACY_SIZES
    return ChunkSizes(int(meta[OTHER_KEY]), int(meta[FLOAT_KEY]))
