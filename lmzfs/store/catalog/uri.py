"""SQLite URI filenames for catalog paths, and what reading a catalog file may raise.

SQLite reads `file:` URIs as URIs: '?' starts the query, '#' a fragment and '%XX' is an escape, so
a store under a directory named `models#2` or `100%` was a different file, or none, to a
read-only connection. Path.as_uri() percent-encodes every such byte.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

# What reading a possibly damaged catalog raises: SQLite's errors, and UnicodeDecodeError, which
# Python's sqlite3 raises in their place when SQLite's message quotes damaged schema text.
READ_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def sqlite_uri(path: Path, *, read_only: bool = False, immutable: bool = False) -> str:
    """The URI that opens exactly the file at `path` (read-only, or read as immutable, if asked)."""
    query = [p for p, on in (("mode=ro", read_only), ("immutable=1", immutable)) if on]
    return Path(path).absolute().as_uri() + ("?" + "&".join(query) if query else "")
