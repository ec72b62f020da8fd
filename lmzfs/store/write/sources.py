"""The files of an added directory: walked once, then each opened once without following anything
that changed since the walk.

The walk records every regular file's identity (device, inode, size, mtime). Opening goes down
from a descriptor of the source root held for the whole add, one component at a time with
O_NOFOLLOW, and opens the file itself with O_NOFOLLOW | O_NONBLOCK: a symlink swapped in
meanwhile fails to open instead of being followed, a FIFO opens at once instead of blocking
until a writer appears, and fstat of the descriptor must show the same regular file the walk
saw. All reads of the file then go through that descriptor.

A symlink may lead out of the source only into one of the ``link_roots`` a caller names (a
Hugging Face cache snapshot's own repo's blobs/, lmzfs/admin/hfcache.py): the file is then opened
the same way, down from a descriptor of that root.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from lmzfs.store.layout import StoreError
from lmzfs.store.names import validate_file_path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class FileIdentity:
    """What must still hold when the file is opened: the walk's view of it."""
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileIdentity":
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class SourceFile:
    rel: str                  # path inside the model, "/"-separated
    parts: tuple[str, ...]    # where to open it below the source root (a symlink's target, resolved at the walk)
    shown: str                # how messages name it
    walked: FileIdentity
    anchor: int = 0           # 0: parts are below the source root; k: below link_roots[k - 1]

    @property
    def size(self) -> int:
        return self.walked.size


class SourceTree:
    """An opened source (directory, or the directory holding a single added file) and its files."""

    def __init__(self, source: Path, link_roots: tuple[Path, ...] = ()):
        self.source = source
        self.link_roots = tuple(Path(os.path.realpath(r)) for r in link_roots)
        self.anchor_fds: list[int] = []
        if not os.path.lexists(source):
            raise StoreError(f"{source}: no such file or directory")
        try:
            real = os.path.realpath(source, strict=True)
        except OSError as exc:
            raise StoreError(f"{source}: {_why_unresolvable(exc)}") from None
        self.resolved = Path(real)
        st = os.stat(real)
        if stat.S_ISDIR(st.st_mode):
            self.root = Path(real)
            single = None
        elif stat.S_ISREG(st.st_mode):
            self.root = Path(real).parent
            single = Path(real).name
        else:
            raise StoreError(f"{source}: not a regular file or directory")
        self.root_fd = os.open(self.root, _DIR_FLAGS)
        try:
            self.anchor_fds = [os.open(r, _DIR_FLAGS) for r in self.link_roots]
            if single is not None:
                self.files = [self._single(single)]
            else:
                self.files = self._walk()
        except BaseException:
            self.close()
            raise
        if not self.files:
            self.close()
            raise StoreError(f"{source}: no files to add")

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1
        for fd in self.anchor_fds:
            os.close(fd)
        self.anchor_fds = []

    def __enter__(self) -> "SourceTree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the walk -----------------------------------------------------------------------------
    def _single(self, name: str) -> SourceFile:
        st = os.stat(name, dir_fd=self.root_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{self.source} changed while being looked at; try again")
        # the model's file keeps the name it was given by, a symlink's own name included
        return SourceFile(validate_file_path(self.source.name or name), (name,), str(self.source),
                          FileIdentity.of(st))

    def _walk(self) -> list[SourceFile]:
        found: list[SourceFile] = []
        try:
            for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=self.root_fd, follow_symlinks=False,
                                                                onerror=_raise):
                dirnames.sort()
                links = [d for d in dirnames if stat.S_ISLNK(os.stat(d, dir_fd=dirfd, follow_symlinks=False).st_mode)]
                prefix = "" if dirpath == "." else dirpath[2:] + "/"
                for name in sorted(filenames) + links:
                    found.append(self._entry(prefix + name, name, dirfd))
        except OSError as exc:
            raise StoreError(f"{self.source}: cannot walk {exc.filename or 'the directory'}: "
                             f"{exc.strerror or exc}") from None
        return found

    def _entry(self, rel: str, name: str, dirfd: int) -> SourceFile:
        shown = f"{self.source}/{rel}"
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        parts = tuple(rel.split("/"))
        anchor = 0
        if stat.S_ISLNK(st.st_mode):
            link = os.readlink(name, dir_fd=dirfd)
            try:
                target = Path(os.path.realpath(self.root / rel, strict=True))
            except OSError as exc:
                raise StoreError(f"{shown} is a symlink to {link}: {_why_unresolvable(exc)}") from None
            anchor = next((k for k, r in enumerate((self.root, *self.link_roots)) if r in target.parents),
                          None if target != self.root else 0)
            if anchor is None:
                raise StoreError(f"{shown} is a symlink to {link}, outside the added "
                                 f"directory; copy the file in or add its target directory instead")
            parts = target.relative_to((self.root, *self.link_roots)[anchor]).parts
            st = os.stat(target)
            if stat.S_ISDIR(st.st_mode):
                raise StoreError(f"{shown} is a symlink to a directory; only files are added")
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{shown} is not a regular file (fifo, socket or device); remove it first")
        return SourceFile(validate_file_path(rel), parts, shown, FileIdentity.of(st), anchor)

    # -- opening ------------------------------------------------------------------------------
    def open(self, src: SourceFile) -> int:
        """A read-only descriptor of ``src``, the very file the walk saw; StoreError otherwise."""
        fd = self.root_fd if src.anchor == 0 else self.anchor_fds[src.anchor - 1]
        dir_fds: list[int] = []
        try:
            try:
                for part in src.parts[:-1]:
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    dir_fds.append(fd)
                ffd = os.open(src.parts[-1], _FILE_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StoreError(f"{src.shown} was replaced by a symlink while being added; refused, "
                                     f"nothing was added") from None
                raise StoreError(f"{src.shown}: {exc.strerror or exc}; nothing was added") from None
        finally:
            for d in dir_fds:
                os.close(d)
        try:
            st = os.fstat(ffd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{src.shown} was replaced by a {_kind(st.st_mode)} while being added; "
                                 f"refused, nothing was added")
            if FileIdentity.of(st) != src.walked:
                raise StoreError(f"{src.shown} changed while being added; nothing was added, try again "
                                 f"when it is stable")
        except BaseException:
            os.close(ffd)
            raise
        return ffd


def _raise(exc: OSError) -> None:
    raise exc      # an unreadable subdirectory fails the add rather than leaving its files out


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISDIR(mode):
        return "directory"
    return "non-regular file"


def _why_unresolvable(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    if exc.errno == errno.ENOENT:
        return "a dangling symlink (its target does not exist)"
    return exc.strerror or str(exc)
