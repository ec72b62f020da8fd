"""What both mounts' request handlers share: turning failures into error replies, and the
lifecycle mount.py's loop asks of any operations object (init, mounted, opens held until the
mount is tuned)."""
from __future__ import annotations

import errno
import functools
import logging
from typing import Any, Callable

import pyfuse3
import trio

from lmzfs.fsmodel.nodes import Attributes
from lmzfs.reader.api import StoreError

log = logging.getLogger(__name__)

IO_BLOCK_SIZE = 128 << 10         # st_blksize: tells cp and stdio to read in large pieces


def fuse_errors(*, logs: Callable[[OSError], bool]):
    """A decorator that turns every failure of a handler into a FUSE error reply: pyfuse3 lets any
    other exception escape its main loop, and one bad request must not take the whole mount down.
    An OSError keeps its errno (logged as a warning where `logs(exc)`); a StoreError (a damaged
    catalog) is said in one line and answered EIO; anything else is logged with its traceback."""
    def decorate(handler):
        @functools.wraps(handler)
        async def wrapper(*args, **kwargs):
            try:
                return await handler(*args, **kwargs)
            except pyfuse3.FUSEError:
                raise
            except OSError as exc:
                if logs(exc):
                    log.warning("%s failed: %s", handler.__name__, exc)
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            except StoreError as exc:
                log.error("%s failed: %s", handler.__name__, exc)
                raise pyfuse3.FUSEError(errno.EIO) from None
            except Exception:
                log.exception("%s failed", handler.__name__)
                raise pyfuse3.FUSEError(errno.EIO) from None
        return wrapper
    return decorate


def entry_attributes(a: Attributes, entry_timeout: float, attr_timeout: float) -> pyfuse3.EntryAttributes:
    """What the kernel is told of an entry, and how long it may trust the name and the attributes."""
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = a.inode
    attrs.generation = 0              # inode numbers are never reused
    attrs.entry_timeout, attrs.attr_timeout = entry_timeout, attr_timeout
    attrs.st_mode = a.mode
    attrs.st_nlink = a.nlink
    attrs.st_uid, attrs.st_gid = a.uid, a.gid
    attrs.st_rdev = 0
    attrs.st_size = a.size
    attrs.st_blksize = IO_BLOCK_SIZE
    attrs.st_blocks = a.blocks
    attrs.st_atime_ns, attrs.st_mtime_ns, attrs.st_ctime_ns = a.atime_ns, a.mtime_ns, a.ctime_ns
    return attrs


class OpenDirs:
    """What opendir opened, by directory handle: readdir answers from it, releasedir drops it."""

    def __init__(self) -> None:
        self._by_fh: dict[int, Any] = {}
        self._next_fh = 1

    def open(self, listing) -> int:
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._by_fh[fh] = listing
        return fh

    def __getitem__(self, fh: int):
        listing = self._by_fh.get(fh)
        if listing is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return listing

    def release(self, fh: int) -> None:
        self._by_fh.pop(fh, None)

    def clear(self) -> None:
        self._by_fh.clear()


def reply_entries(token, entries: list, start_id: int, attributes: Callable, remember: Callable) -> None:
    """Answer readdir from the (name, item) listing opendir took: the entries from `start_id` on,
    until the kernel's buffer is full. An entry's next_id is its index plus one, so 0 always means
    "from the top"; each entry handed over is a reference the kernel holds (readdirplus), which
    `remember(item)` counts, but for `.` and `..`, which the kernel skips."""
    for index in range(start_id, len(entries)):
        name, item = entries[index]
        if not pyfuse3.readdir_reply(token, name, attributes(item), index + 1):
            break
        if name not in (b".", b".."):
            remember(item)


class MountLifecycle:
    """The part of an operations object that mount.py's loop drives."""

    def __init__(self) -> None:
        self._mounted = False               # kernel notifications only make sense when mounted
        self._initialised: trio.Event | None = None
        self._opens_held: trio.Event | None = None

    def init(self) -> None:
        # pyfuse3 calls this inside libfuse's handling of INIT, which writes the reply as soon as
        # it returns, before the request loop yields to trio: whoever wakes on the event runs
        # after the kernel has taken the reply (and reset the read-ahead window from it)
        self._mounted = True
        if self._initialised is not None:
            self._initialised.set()

    @property
    def mounted(self) -> bool:
        """True once the kernel's INIT request has been answered (pyfuse3 calls init() then)."""
        return self._mounted

    async def wait_initialised(self) -> None:
        """Return once the kernel's INIT request has been answered."""
        if self._mounted:
            return
        if self._initialised is None:
            self._initialised = trio.Event()
        await self._initialised.wait()

    def hold_opens_until(self, event: trio.Event) -> None:
        """Answer no open() before *event* is set.

        The kernel gives a file the mount's read-ahead window as it is when the open is answered,
        and keeps it while the file stays open; the mountpoint appears before the daemon has
        widened that window (mount.py's when_initialised), so a reader that opens at once would
        otherwise read in 128 KiB requests, and mmap faults fetch as little, until it reopens."""
        self._opens_held = event

    async def opens_allowed(self) -> None:
        """Wait, in open(), until opens are no longer held."""
        if self._opens_held is not None and not self._opens_held.is_set():
            await self._opens_held.wait()
