"""Single-file archives (`lmz pack` / `lmz unpack`): one model file in one compressed file,
with the store's chunker and codecs, streaming and checked. Format: docs/format.md."""
from .errors import (DestinationExists, InvalidArchive, OutputLimitExceeded, SingleFileError, SourceChanged,
                     UsageError)
from .reader import unpack_file
from .report import PackReport, UnpackReport
from .writer import pack_file

__all__ = ["pack_file", "unpack_file", "PackReport", "UnpackReport", "SingleFileError", "InvalidArchive",
           "OutputLimitExceeded", "SourceChanged", "UsageError", "DestinationExists"]
