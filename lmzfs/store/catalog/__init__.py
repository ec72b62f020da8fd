"""The catalog: the one place a store's SQL is written (db; the rows writers insert, move and
drop in chunkrows and modelrows; counts in stats), with its checks (check), copies (copies) and
repair (repair)."""
from lmzfs.store.catalog.db import (CATALOG_VERSION, MAX_CHAIN_HOPS, READABLE_VERSIONS, SCHEMA, TABLES,
                                    Catalog, CatalogDamaged, Extent, FileRow, ModelRow, ModelUsage,
                                    StoredTensor, TensorRow, catalog_error, failure_words, free_if_full, is_damage,
                                    readonly_uri, tables_of)

__all__ = ["CATALOG_VERSION", "MAX_CHAIN_HOPS", "READABLE_VERSIONS", "SCHEMA", "TABLES", "Catalog",
           "CatalogDamaged", "Extent", "FileRow", "ModelRow", "ModelUsage", "StoredTensor", "TensorRow",
           "catalog_error", "failure_words", "free_if_full", "is_damage", "readonly_uri", "tables_of"]
