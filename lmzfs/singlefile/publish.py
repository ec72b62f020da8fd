"""Where pack and unpack write: a temporary file beside the destination, published by rename.

The destination is either untouched or holds the complete, checked, fsync'd result: output goes
to a hidden temporary file in the same directory (so the rename cannot cross file systems), is
flushed and fsync'd, then renamed into place and the directory fsync'd. On any failure the
temporary file is removed.
"""
from __future__ import annotations

import errno
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lmzfs.store.layout import fsync_dir

from .errors import DestinationExists, UsageError


def check_source(src: Path, *, regular: bool) -> None:
    """``regular``: the source is read with pread (pack), so pipes and devices are refused."""
    if not src.exists():
        raise UsageError(f"{src}: no such file")
    if src.is_dir():
        raise UsageError(f"{src} is a directory; give a file")
    if regular and not src.is_file():
        raise UsageError(f"{src} is not a regular file")


def check_destination(dest: Path, overwrite: bool, report: str | os.PathLike | None) -> None:
    """Refuse early, before any work, what publish() or the report would refuse at the end."""
    if dest.is_dir():
        raise UsageError(f"{dest} is a directory; give the output file's path")
    if (dest.exists() or dest.is_symlink()) and not overwrite:
        raise DestinationExists(f"{dest} exists; pass --overwrite to replace it")
    if not dest.parent.is_dir():
        raise UsageError(f"{dest.parent}: no such directory")
    if report is not None and not Path(report).parent.is_dir():
        raise UsageError(f"{Path(report).parent}: no such directory for the report")


class PendingOutput:
    """A temporary file beside ``dest``; ``publish()`` moves it into place, ``discard()`` removes it."""

    def __init__(self, dest: Path):
        self.dest = dest
        while True:
            self.path = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.part")
            try:
                # 0o666 minus the umask, like any file the user creates (mkstemp would give 0o600)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                break
            except FileExistsError:
                continue
        self.file = os.fdopen(fd, "wb", buffering=1 << 20)

    def publish(self, overwrite: bool) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        if overwrite:
            os.replace(self.path, self.dest)
        else:
            _rename_no_clobber(self.path, self.dest)
        fsync_dir(self.dest.parent)

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _rename_no_clobber(tmp: Path, dest: Path) -> None:
    # link() fails if dest exists, atomically, so a file created there since check_destination
    # is never replaced. File systems without hard links fall back to check-then-rename.
    try:
        os.link(tmp, dest)
    except FileExistsError:
        raise DestinationExists(f"{dest} exists; pass --overwrite to replace it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
            raise
        if dest.exists() or dest.is_symlink():
            raise DestinationExists(f"{dest} exists; pass --overwrite to replace it") from None
        os.rename(tmp, dest)
        return
    os.unlink(tmp)


@contextmanager
def published(dest: Path, overwrite: bool) -> Iterator[PendingOutput]:
    """A PendingOutput for `dest`, published when the block ends, discarded if it raises."""
    out = PendingOutput(dest)
    try:
        yield out
        out.publish(overwrite)
    except BaseException:
        out.discard()
        raise
