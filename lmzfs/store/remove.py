"""`lmz rm`: drop models from the catalog in one transaction. Their chunks stay in the packs
(with fewer references) until `lmz gc`, so a mount that has a removed file open keeps reading it.
A chunk that another chunk is coded against keeps that reference in its count (chunks.refs), so
`lmz gc` keeps it for as long as a dependant needs it, whichever models are removed."""
from __future__ import annotations

from lmzfs.store.catalog import Catalog
from lmzfs.store.catalog.modelrows import delete_model
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
                    removed += delete_model(db, row.id)
            return removed
        finally:
            catalog.close()
