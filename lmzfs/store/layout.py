"""Where a store lives on disk and how it is recognised.

    STORE/
      FORMAT              "lmzfs-store 1\n": the store layout version; unknown versions are refused
      catalog.sqlite      models, files, extents, chunks (SQLite, WAL)
      packs/pack-NNNNNNNN.lmzp   append-only chunk payloads
      lock                flock(2) target that serialises writers

Only the owner may read a store: directories are created 0700 and files 0600, because packs and
the catalog (which records source paths) would otherwise hand every local user what the mount
refuses them. Other users see models only through a mount made with allow_other.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STORE_FORMAT = "lmzfs-store"
STORE_VERSION = 1
DIR_MODE, FILE_MODE = 0o700, 0o600


class StoreError(RuntimeError):
    """A user-facing failure of a store operation; the CLI prints its message, without a traceback."""


def user_store_dir() -> Path:
    """The store a user gets when nothing names another."""
    return Path.home() / ".local" / "share" / "lmzfs"


def default_store_dir() -> Path:
    """$LMZ_STORE, else the user's store."""
    env = os.environ.get("LMZ_STORE")
    return Path(env) if env else user_store_dir()


class _Under:
    """One of the store's fixed entries (the module docstring's tree): its path below the root."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, paths: StorePaths | None, owner=None):
        return self if paths is None else paths.root / self.name


@dataclass(frozen=True)
class StorePaths:
    root: Path

    format_file = _Under("FORMAT")
    catalog = _Under("catalog.sqlite")
    packs = _Under("packs")
    lock = _Under("lock")

    def pack(self, pack_id: int) -> Path:
        return self.packs / f"pack-{pack_id:08d}.lmzp"

    def disk_bytes(self) -> int:
        """Bytes on disk of the packs and the catalog (a pack that gc removes meanwhile counts 0)."""
        total = 0
        for p in [*self.packs.glob("pack-*.lmzp"), *self.root.glob("catalog.sqlite*")]:
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def exists(self) -> bool:
        return self.format_file.is_file()

    def check_format(self) -> None:
        """Refuse a directory that is not a store, or a store of a version this code does not know."""
        if not self.exists():
            raise StoreError(f"no lmzfs store at {self.root} (run `lmz add` to create one, or pass --store)")
        text = self.format_file.read_text(errors="replace").strip()
        name, _, version = text.partition(" ")
        if name != STORE_FORMAT or not version.isdigit():
            raise StoreError(f"{self.format_file}: not an lmzfs store marker: {text[:60]!r}")
        if int(version) != STORE_VERSION:
            raise StoreError(f"{self.root}: store format version {version} is not supported "
                             f"(this lmzfs reads version {STORE_VERSION})")

    def create(self) -> None:
        """Create an empty store directory (idempotent); the marker is written last, durably."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.packs):
            try:
                d.mkdir(mode=DIR_MODE)
            except FileExistsError:
                pass
        if self.exists():
            self.check_format()
            return
        # A directory made beforehand (mkdir -p, a volume) becomes the owner's alone with its store.
        os.chmod(self.root, DIR_MODE)
        os.chmod(self.packs, DIR_MODE)
        tmp = self.root / "FORMAT.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        with open(fd, "w") as f:
            f.write(f"{STORE_FORMAT} {STORE_VERSION}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.format_file)
        fsync_dir(self.root)


def fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    """Make what was written to the file at path durable (a file written by another handle, as
    SQLite's backup or shutil.copyfile)."""
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fsync_path(path, os.O_RDONLY | os.O_DIRECTORY)
