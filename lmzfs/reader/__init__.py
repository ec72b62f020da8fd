"""Random access to stored files: decode only the chunks a read touches, verified, cached."""
from lmzfs.reader.api import CorruptChunk, FileEntry, StoreTotals
from lmzfs.reader.archive import Archive, FileReader

__all__ = ["Archive", "FileReader", "FileEntry", "StoreTotals", "CorruptChunk"]
