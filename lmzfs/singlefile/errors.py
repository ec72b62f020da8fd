"""Errors of `lmz pack` / `lmz unpack`. Each carries the CLI exit status it maps to.

Kept free of heavy imports so the CLI can name these classes without loading the codecs.
"""
from __future__ import annotations


class SingleFileError(Exception):
    """Packing or unpacking failed; nothing was published at the destination."""

    exit_status = 1


class InvalidArchive(SingleFileError):
    """The archive is not one this build reads: bad magic, unknown version, truncated, damaged,
    trailing data, or fields that do not add up."""


class OutputLimitExceeded(SingleFileError):
    """The archive would unpack to more bytes than --max-output-bytes allows."""


class SourceChanged(SingleFileError):
    """The file being packed changed while it was read; packing it again when stable will work."""


class UsageError(SingleFileError):
    """The command cannot run as given: missing source, destination exists or is a directory."""

    exit_status = 2


class DestinationExists(UsageError):
    """The destination exists and --overwrite was not given."""
