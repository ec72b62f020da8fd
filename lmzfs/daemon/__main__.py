"""``python -m lmzfs.daemon [--foreground] MOUNTPOINT``: mount a store (the server process's entry point).

Without ``--foreground`` it starts itself again as a background server and returns once the mount
is live; ``lmz mount`` does the same through ``lmzfs.daemon.mount.mount``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmzfs.daemon.mount import configure_logging, mount, resolve_store_dir, serve
from lmzfs.hostresources import default_cache_size
from lmzfs.malloc import tune_malloc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lmzfs.daemon", description="Mount an lmzfs store read-only.")
    parser.add_argument("mountpoint", type=Path, help="an existing empty directory")
    parser.add_argument("--store", help="store directory (default: $LMZ_STORE or ~/.local/share/lmzfs)")
    parser.add_argument("--foreground", action="store_true", help="serve in this process until unmounted")
    parser.add_argument("--allow-other", action="store_true", help="let other users read the mount")
    parser.add_argument("--cache-bytes", type=int, default=None,
                        help="decoded-chunk cache size (default: 1/8 of the usable memory, 32 MiB to 256 MiB)")
    parser.add_argument("--workers", type=int, default=None, help="read threads (default: the usable CPUs)")
    parser.add_argument("--no-readahead", dest="readahead", action="store_false",
                        help="decode only what is read, nothing ahead of sequential readers")
    parser.add_argument("--writable", action="store_true",
                        help="serve a writable file system: top-level directories are models (docs/writable.md)")
    parser.add_argument("--remote", metavar="URL", help="serve this remote store (s3://BUCKET/PREFIX, https://...)")
    parser.add_argument("--cache-dir", type=Path, help="with --remote: fetched ranges and snapshots")
    parser.add_argument("--remote-cache-bytes", type=int, default=20 << 30, help="with --remote: disk cache bytes")
    parser.add_argument("--poll", type=float, default=30.0, help="with --remote: seconds between polls")
    parser.add_argument("--remote-timeout", type=float, default=30.0, help="with --remote: seconds a read waits")
    parser.add_argument("--endpoint", help="with --remote: the S3-compatible engine's URL")
    parser.add_argument("--debug", action="store_true", help="log every detail")
    # Internal: the launcher's readiness pipe, and a test hook naming the archive to serve.
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--archive-factory", default=None, help=argparse.SUPPRESS)
    # Internal: a writable mount's floor of dead pack bytes before it reclaims them (tests).
    parser.add_argument("--reclaim-floor", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.debug)
    tune_malloc()
    if args.cache_bytes is None:
        args.cache_bytes = default_cache_size()
    mountpoint = args.mountpoint.absolute()
    store_dir = resolve_store_dir(args.store).absolute()
    remote = None
    if args.remote:
        from lmzfs.reader.remotearchive import RemoteOptions
        remote = RemoteOptions(args.remote, cache_dir=args.cache_dir, disk_cache_bytes=args.remote_cache_bytes,
                               poll_s=args.poll, timeout_s=args.remote_timeout, endpoint=args.endpoint)
    if not args.foreground:
        return mount(mountpoint, store_dir, foreground=False, allow_other=args.allow_other,
                     cache_bytes=args.cache_bytes, workers=args.workers, archive_factory=args.archive_factory,
                     readahead=args.readahead, writable=args.writable, remote=remote)
    if args.ready_fd is not None:
        os.chdir("/")     # a background server must not keep the launcher's directory busy
    return serve(mountpoint, store_dir, allow_other=args.allow_other, cache_bytes=args.cache_bytes,
                 workers=args.workers, archive_factory=args.archive_factory, ready_fd=args.ready_fd,
                 readahead=args.readahead, writable=args.writable, remote=remote,
                 reclaim_floor=args.reclaim_floor)


if __name__ == "__main__":
    sys.exit(main())
