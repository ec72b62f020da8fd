"""`lmz rm`: drop models from the catalog in one transaction. Their chunks stay in the packs
(with fewer references) until `lmz gc`, so a mount that has a removed file open keeps reading it.
A chunk that another chunk is coded against keeps that reference in its count (chunks.refs), so
`lmz gc` keeps it for as long as a dependant needs it, whichever models are removed."""
from __future__ import annotations

from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock


def remove_models(store: StorePaths, names: list[str]) -> int:
    """Remove the named models; returns how many files went. All names must exist, or nothing changes."""
    store.check_format()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        try:
            rows = []
            for name in names:
                row = catalog.model(name)
                if row is None:
                    raise StoreError(f"no model named {name!r} (see `lmz ls`)")
                rows.append(row)
            removed = 0
            with catalog.transaction() as db:
                for row in rows:
                    db.execute("CREATE TEMP TABLE IF NOT EXISTS gone(chunk BLOB, n INTEGER)")
                    db.execute("DELETE FROM gone")
                    db.execute("INSERT INTO gone SELECT e.chunk, COUNT(*) FROM extents e JOIN files f ON f.id = e.file "
                               "WHERE f.model = ? GROUP BY e.chunk", (row.id,))
                    db.execute("UPDATE chunks SET refs = refs - (SELECT n FROM gone WHERE gone.chunk = chunks.id) "
                               "WHERE id IN (SELECT chunk FROM gone)")
                    db.execute("DELETE FROM extents WHERE file IN (SELECT id FROM files WHERE model = ?)", (row.id,))
                    db.execute("DELETE FROM tensors WHERE file IN (SELECT id FROM files WHERE model = ?)", (row.id,))
                    removed += db.execute("DELETE FROM files WHERE model = ?", (row.id,)).rowcount
                    db.execute("DELETE FROM models WHERE id = ?", (row.id,))
            return removed
        finally:
            catalog.close()
