"""Mounting and unmounting: checks with clear errors, the foreground server, and the background
launcher that starts the server as its own process and waits until the mount is live.

The server always runs in a process that does nothing else: a program that mmaps a file served
by its own process can deadlock (the page fault waits on the daemon, the daemon on the GIL).
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lmzfs.daemon.kernel_readahead import raise_kernel_readahead
from lmzfs.hostresources import MAX_CACHE, raise_open_files_limit
from lmzfs.mountinfo import is_mount_point

log = logging.getLogger(__name__)

MOUNT_OPTIONS = frozenset({"fsname=lmzfs", "subtype=lmzfs", "ro", "default_permissions", "noatime"})
WRITABLE_MOUNT_OPTIONS = frozenset({"fsname=lmzfs", "subtype=lmzfs", "default_permissions"})
USAGE_ERROR = 2
READY_TIMEOUT = 120.0            # opening a large store may take a while, but not forever
INIT_WAIT_SECONDS = 5.0         # the kernel sends INIT as soon as the mount exists
LOG_NAME = "mount.log"


class MountError(Exception):
    """A problem the user can fix; reported as one line, exit status 2."""


def resolve_store_dir(store: str | os.PathLike | None = None) -> Path:
    """``--store DIR``, else the default store (store/layout.py: ``$LMZ_STORE`` or the user's)."""
    from lmzfs.store.layout import default_store_dir
    return Path(store).expanduser() if store else default_store_dir().expanduser()


def check_mountpoint(mountpoint: Path) -> None:
    if is_mount_point(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point (unmount it first: lmz umount {mountpoint})")
    if not mountpoint.exists():
        raise MountError(f"mountpoint {mountpoint} does not exist (create it with: mkdir -p {mountpoint})")
    if not mountpoint.is_dir():
        raise MountError(f"mountpoint {mountpoint} is not a directory")
    if any(mountpoint.iterdir()):
        raise MountError(f"mountpoint {mountpoint} is not empty")


def check_store(store_dir: Path) -> None:
    """Refuse a missing store, and a store whose catalog is damaged, in one line each."""
    if not store_dir.is_dir():
        raise MountError(f"no store at {store_dir}; add a model first with: lmz add")
    from lmzfs.store.catalog.check import diagnose
    from lmzfs.store.layout import StoreError, StorePaths
    store = StorePaths(store_dir)
    if store.exists():
        try:
            verdict = diagnose(store, check_packs=False)
        except StoreError as exc:       # the catalog cannot be read now (a full disk): not damage
            raise MountError(str(exc)) from None
        if not verdict.sound:
            raise MountError(f"catalog {store.catalog} is damaged: run lmz verify --repair ({verdict.problem})")


def _load_factory(spec: str):
    """``"package.module:name"`` -> the callable it names."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise MountError(f"archive factory {spec!r} is not of the form module:name")
    return getattr(importlib.import_module(module_name), attr)


def _factory_spec(factory) -> str:
    """The import path of *factory*, so a child process can load the same one."""
    if isinstance(factory, str):
        return factory
    spec = f"{factory.__module__}:{factory.__qualname__}"
    if "<" in spec or _load_factory(spec) is not factory:
        raise ValueError(f"archive_factory {factory!r} cannot be imported by name in the daemon process")
    return spec


def _default_factory(store_dir: Path, cache_bytes: int, workers: int | None = None):
    from lmzfs.reader.archive import Archive
    return Archive(store_dir, cache_bytes=cache_bytes, workers=workers, copy_on_damage=True)


def configure_logging(debug: bool = False) -> None:
    """Log to stderr; under systemd (stderr is the journal) without timestamps, which it adds."""
    journal = bool(os.environ.get("JOURNAL_STREAM"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, stream=sys.stderr,
                        format=("" if journal else "%(asctime)s ") + "%(levelname)s %(name)s: %(message)s")


def _report(message: str) -> None:
    print(f"lmz: {message}", file=sys.stderr)


def _write_ready(ready_fd: int | None, message: str) -> None:
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, message.encode() + b"\n")
    except OSError:
        pass                      # the launcher went away; the mount itself is unaffected
    os.close(ready_fd)


# -- the server ---------------------------------------------------------------------------------

def serve(mountpoint: Path, store_dir: Path, *, allow_other: bool = False, cache_bytes: int = MAX_CACHE,
          workers: int | None = None, archive_factory=None, ready_fd: int | None = None,
          readahead: bool = True, notifier=None, writable: bool = False, remote=None,
          reclaim_floor: int | None = None) -> int:
    """Mount and serve in this process until unmounted or sent SIGTERM/SIGINT.

    *remote* (a RemoteOptions): serve that remote store (reader/remotearchive.py), not store_dir.

    If *ready_fd* is given, one line goes to it once the mount is live ("ready") or has failed
    ("error STATUS MESSAGE"), and it is closed. The service manager (``$NOTIFY_SOCKET``, or
    *notifier*) gets READY=1 once the kernel has the mount and STOPPING=1 when it goes.
    *readahead* False gives the archive no read-ahead workers; reads still run in up to
    *workers* threads. *writable*: serve the store as a writable file system (daemon/writable.py);
    *reclaim_floor*: its dead pack bytes reclaimed past this many (None: fsmodel/reclaim.py's default).
    """
    import pyfuse3
    import trio

    from lmzfs.daemon.notify import Notifier
    from lmzfs.daemon.operations import LmzOperations
    from lmzfs.store.layout import StoreError

    notifier = notifier or Notifier()
    raise_open_files_limit()

    mountpoint, store_dir = Path(mountpoint).absolute(), Path(store_dir).absolute()
    try:
        check_mountpoint(mountpoint)
        if remote is not None:
            from lmzfs.reader.remotearchive import RemoteArchive
            archive = RemoteArchive(remote, cache_bytes=cache_bytes, workers=workers if readahead else 0)
            store_dir = archive.url
        elif writable:
            from lmzfs.fsmodel.filesystem import Filesystem
            archive = Filesystem(store_dir, cache_bytes=cache_bytes, workers=workers, background_commits=True,
                                 **({} if reclaim_floor is None else {"reclaim_floor": reclaim_floor}))
        else:
            check_store(store_dir)
            factory = archive_factory or _default_factory
            if isinstance(factory, str):
                factory = _load_factory(factory)
            archive = factory(store_dir, cache_bytes, workers if readahead else 0)
    except (MountError, StoreError) as exc:       # no store, unknown format, unreadable catalog
        _report(str(exc))
        _write_ready(ready_fd, f"error {USAGE_ERROR} {exc}")
        return USAGE_ERROR
    except Exception as exc:
        log.exception("cannot open the store at %s", store_dir)
        _write_ready(ready_fd, f"error 1 cannot open the store at {store_dir}: {exc}")
        return 1

    if writable:
        from lmzfs.daemon.writable import WritableOperations
        ops = WritableOperations(archive, workers=workers)
    else:
        ops = LmzOperations(archive, workers=workers)
    options = set(WRITABLE_MOUNT_OPTIONS if writable else MOUNT_OPTIONS) | ({"allow_other"} if allow_other else set())
    # Until trio's signal receiver is installed (and after it is gone), SIGTERM and SIGINT must
    # still unmount: turn them into an exception that reaches the finally below.
    previous = {signum: signal.signal(signum, _exit_on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            pyfuse3.init(ops, str(mountpoint), options)
        except Exception as exc:
            ops.close_all()
            _report(f"cannot mount {mountpoint}: {exc}")
            _write_ready(ready_fd, f"error 1 cannot mount {mountpoint}: {exc}")
            return 1
        try:
            log.info("serving %s at %s (%d entries)", store_dir, mountpoint, len(ops.tree))

            def announce_ready() -> None:
                _write_ready(ready_fd, "ready")
                notifier.ready(_service_status(archive, store_dir, mountpoint))

            trio.run(_main_loop, ops, archive, notifier, store_dir, mountpoint, announce_ready)
        finally:
            notifier.stopping(f"unmounting {mountpoint}")
            pyfuse3.close(unmount=True)
            ops.close_all()
            log.info("unmounted %s", mountpoint)
    except SystemExit:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def _exit_on_signal(signum, frame):
    raise SystemExit(0)


def _service_status(archive, store_dir: Path, mountpoint: Path) -> str:
    try:
        models = archive.model_count() if hasattr(archive, "model_count") else len({e.model for e in archive.files()})
    except Exception:                       # a status line is not worth failing over
        log.exception("counting the models of %s", store_dir)
        return f"serving {store_dir} at {mountpoint}"
    return f"serving {models} model{'' if models == 1 else 's'} from {store_dir} at {mountpoint}"


async def _report_changes(archive, notifier, store_dir: Path, mountpoint: Path, interval: float = 2.0) -> None:
    """Keep the service manager's STATUS= current as models are added and removed."""
    import trio

    seen = archive.generation()
    while True:
        await trio.sleep(interval)
        generation = archive.generation()
        if generation != seen:
            seen = generation
            notifier.status(_service_status(archive, store_dir, mountpoint))


async def _main_loop(ops, archive=None, notifier=None, store_dir=None, mountpoint=None, announce_ready=None) -> None:
    import pyfuse3
    import trio

    async def terminate_on_signal():
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("got %s, unmounting", signal.Signals(signum).name)
                pyfuse3.terminate()
                return

    widened = trio.Event()
    ops.hold_opens_until(widened)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(terminate_on_signal)
        nursery.start_soon(ops.refresh_periodically, 1.0)
        nursery.start_soon(when_initialised, ops, mountpoint, announce_ready, widened)
        if notifier is not None and notifier.enabled:
            nursery.start_soon(_report_changes, archive, notifier, store_dir, mountpoint)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()     # main returned: unmounted or terminated


async def when_initialised(ops, mountpoint, announce_ready, widened=None) -> None:
    """Once the kernel's INIT request has been answered: widen the mount's read-ahead window, then
    let opens through (*widened*) and tell the launcher and the service manager that the mount is
    ready.

    The kernel sets the window from the INIT reply (128 KiB), undoing any value written before,
    and a file takes the window it finds when its open is answered; so opens and readiness wait
    for the widening, or a reader that starts as soon as the mountpoint appears (before `lmz
    mount` returns) would read in 128 KiB requests for as long as it has the file open."""
    import trio

    try:
        with trio.move_on_after(INIT_WAIT_SECONDS):     # INIT comes with the first turn of the loop
            await ops.wait_initialised()
        if mountpoint is not None and ops.mounted:
            raise_kernel_readahead(mountpoint)
    finally:
        if widened is not None:           # whatever happened, opens must not wait for ever
            widened.set()
    if announce_ready is not None:
        announce_ready()


# -- the public entry points ------------------------------------------------------------------

def mount(mountpoint: Path, store_dir: Path, *, foreground: bool, allow_other: bool, cache_bytes: int,
          workers: int | None = None, archive_factory=None, readahead: bool = True, writable: bool = False,
          remote=None) -> int:
    """Mount the store at *mountpoint*; returns an exit status.

    In the foreground this serves until unmounted (call it only from a process that does nothing
    else). In the background it starts the server as a separate process, returns 0 once the mount
    is live, or prints the server's error and returns non-zero.
    """
    from lmzfs.store.layout import StoreError, StorePaths

    mountpoint, store_dir = Path(mountpoint).absolute(), Path(store_dir).absolute()
    if foreground:
        return serve(mountpoint, store_dir, allow_other=allow_other, cache_bytes=cache_bytes,
                     workers=workers, archive_factory=archive_factory, readahead=readahead, writable=writable,
                     remote=remote)
    try:
        check_mountpoint(mountpoint)
        if remote is not None:
            pass                      # the server reports an unreachable or empty remote itself
        elif writable:                  # a writable mount creates its store if there is none
            StorePaths(store_dir).create()
        else:
            check_store(store_dir)
    except MountError as exc:
        _report(str(exc))
        return USAGE_ERROR
    except StoreError as exc:
        _report(str(exc))
        return USAGE_ERROR
    argv = [sys.executable, "-m", "lmzfs.daemon", "--foreground", "--store", str(store_dir),
            "--cache-bytes", str(cache_bytes)]
    if allow_other:
        argv.append("--allow-other")
    if workers:
        argv += ["--workers", str(workers)]
    if not readahead:
        argv.append("--no-readahead")
    if writable:
        argv.append("--writable")
    if archive_factory is not None:
        argv += ["--archive-factory", _factory_spec(archive_factory)]
    if remote is not None:
        argv += remote_argv(remote)
        return _launch(argv, mountpoint, remote_log_path(remote))
    return _launch(argv, mountpoint, log_path(store_dir))


def remote_argv(remote) -> list[str]:
    """The server's flags for a RemoteOptions (the URL holds no credentials: they stay in the
    environment the server inherits)."""
    argv = ["--remote", remote.url, "--remote-cache-bytes", str(remote.disk_cache_bytes),
            "--poll", f"{remote.poll_s:g}", "--remote-timeout", f"{remote.timeout_s:g}"]
    if remote.cache_dir is not None:
        argv += ["--cache-dir", str(remote.cache_dir)]
    if remote.endpoint:
        argv += ["--endpoint", remote.endpoint]
    return argv


def remote_log_path(remote) -> Path:
    """A background remote mount logs into its cache directory."""
    from lmzfs.reader.remotearchive import default_cache_dir
    from lmzfs.store.remote.objects import RemoteURL
    folder = Path(remote.cache_dir) if remote.cache_dir else default_cache_dir(RemoteURL.parse(remote.url))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / LOG_NAME


def log_path(store_dir: Path) -> Path:
    """Where a background mount logs: the store's mount.log, or, for a store on a read-only file
    system (or one this user may not write), a file named after the store in the user's runtime
    directory ($XDG_RUNTIME_DIR, else the temporary directory)."""
    if os.access(store_dir, os.W_OK):
        return store_dir / LOG_NAME
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    tag = hashlib.sha256(os.fsencode(store_dir)).hexdigest()[:12]
    return base / f"lmzfs-{os.getuid()}-{tag}-{LOG_NAME}"


def _launch(argv: list[str], mountpoint: Path, log_path: Path) -> int:
    try:
        # never through a symlink planted at the name (the runtime directory may be the shared /tmp)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        _report(f"cannot open the mount's log {log_path}: {exc.strerror or exc}")
        return USAGE_ERROR
    log_start = os.fstat(log_fd).st_size
    ready_r, ready_w = os.pipe()
    argv = argv + ["--ready-fd", str(ready_w), str(mountpoint)]
    # A background server is not the process a service manager watches: it must not claim READY.
    env = {key: value for key, value in os.environ.items() if key != "NOTIFY_SOCKET"}
    try:
        with open(log_fd, "ab") as log_file, open(os.devnull, "rb") as devnull:
            child = subprocess.Popen(argv, stdin=devnull, stdout=log_file, stderr=log_file,
                                     pass_fds=(ready_w,), start_new_session=True, env=env)
        os.close(ready_w)
        ready_w = None
        line = _read_line(ready_r, READY_TIMEOUT)
    finally:
        os.close(ready_r)
        if ready_w is not None:
            os.close(ready_w)

    if line == "ready":
        # Reap the server when it exits (no zombie, no "still running" warning for the Popen).
        threading.Thread(target=child.wait, name=f"lmzfs-daemon-{child.pid}", daemon=True).start()
        return 0
    if line is None:
        child.kill()
        message = f"the file system did not come up within {READY_TIMEOUT:.0f}s"
    elif line.startswith("error "):
        status, _, message = line[len("error "):].partition(" ")
        child.wait()
        if status == str(USAGE_ERROR):
            _report(message)
            return USAGE_ERROR
    else:
        message = "the mount process exited before the file system came up"
    child.wait()
    _report(f"{message}; see {log_path}")
    tail = _log_tail(log_path, log_start)
    if tail:
        print(tail, file=sys.stderr)
    return child.returncode or 1


def _read_line(fd: int, timeout: float) -> str | None:
    """The first line written to *fd*, "" if closed without one, None on timeout."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


def _log_tail(log_path: Path, start: int, lines: int = 20) -> str:
    try:
        with open(log_path, "rb") as log_file:
            log_file.seek(start)
            text = log_file.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def umount(mountpoint: Path) -> int:
    """Unmount a mounted store; returns an exit status."""
    mountpoint = Path(mountpoint).absolute()
    if not is_mount_point(mountpoint):
        _report(f"{mountpoint} is not mounted")
        return USAGE_ERROR
    result = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True, text=True)
    if result.returncode != 0:
        detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "fusermount3 failed"
        _report(f"cannot unmount {mountpoint}: {detail}")
        return 1
    return 0
