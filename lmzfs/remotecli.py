"""The `lmz` commands of remote stores: push (and prune), and `--remote` on ls, cat, verify,
stats and doctor. Argument parsing and output only; lmzfs/cli.py wires them in, the work is in
lmzfs/store/remote/ and lmzfs/reader/remotearchive.py."""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lmzfs.config import parse_seconds, resolve
from lmzfs.printable import printable
from lmzfs.progress import ProgressLine, human_bytes
from lmzfs.store.layout import StoreError


def _duration(text: str) -> float:
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_remote_option(sp: argparse.ArgumentParser, *, what: str) -> None:
    sp.add_argument("--remote", metavar="URL", default=None,
                    help=f"{what} a remote store (s3://BUCKET/PREFIX, or read-only https://HOST/PREFIX) instead "
                         f"of the local one (default: the config's remote, for mount only)")
    sp.add_argument("--cache-dir", metavar="DIR", default=None,
                    help="with --remote: where fetched ranges and snapshots are kept (default: the config's "
                         "remote_cache_dir, else ~/.cache/lmzfs/remote/NAME)")


def add_mount_remote_arguments(sp: argparse.ArgumentParser) -> None:
    add_remote_option(sp, what="serve")
    sp.add_argument("--poll", type=_duration, default=None, metavar="SECONDS",
                    help="with --remote: look for a newer snapshot this often (default 30s; 0: never)")
    sp.add_argument("--remote-timeout", type=_duration, default=None, metavar="SECONDS",
                    help="with --remote: the most a read waits for the engine, retries included (default 30s); "
                         "past it the read fails with EIO")


def remote_options(args, *, mount: bool = False, disk_cache_bytes: int | None = None):
    """The RemoteOptions the flags and the config give, or None for the local store. Only mount
    takes the config's `remote` (a host that mounts a remote store has no store of its own)."""
    from lmzfs.reader.remotearchive import RemoteOptions
    if not mount and getattr(args, "remote", None) is None:      # the config is read only when it can matter
        if getattr(args, "cache_dir", None):
            raise StoreError("--cache-dir is for a remote store: give --remote URL too")
        return None
    s = resolve(remote=getattr(args, "remote", None), remote_cache_dir=getattr(args, "cache_dir", None),
                remote_cache_size=disk_cache_bytes, remote_poll=getattr(args, "poll", None))
    if s.remote is None or (not mount and s.sources.get("remote") != "flag"):
        if getattr(args, "cache_dir", None):
            raise StoreError("--cache-dir is for a remote store: give --remote URL too")
        return None
    return RemoteOptions(s.remote, cache_dir=s.remote_cache_dir, disk_cache_bytes=s.remote_cache_size,
                         poll_s=s.remote_poll if mount else 0.0,
                         timeout_s=getattr(args, "remote_timeout", None) or s.remote_timeout,
                         endpoint=s.remote_endpoint)


def open_remote(options, *, check_ids: bool = False, cache_bytes: int = 64 << 20, workers: int | None = None):
    from lmzfs.reader.remotearchive import RemoteArchive
    return RemoteArchive(options, cache_bytes=cache_bytes, workers=workers, check_ids=check_ids)


@contextmanager
def remote_catalog(options) -> Iterator[tuple]:
    """(the current snapshot's Catalog, the archive) for `lmz ls --remote`."""
    archive = open_remote(options, workers=0)
    try:
        yield archive.catalog_for_listing(), archive
    finally:
        archive.close()


# -- push ---------------------------------------------------------------------------------------

def cmd_push(args) -> int:
    from lmzfs.config import resolve_store
    from lmzfs.store.layout import StorePaths
    from lmzfs.store.remote.objects import ObjectStore, RemoteURL
    from lmzfs.store.remote.prune import prune
    from lmzfs.store.remote.push import push
    s = resolve()
    url = RemoteURL.parse(args.remote or s.remote or _no_remote())
    objects = ObjectStore(url, endpoint=s.remote_endpoint, timeout=s.remote_timeout)
    store = StorePaths(resolve_store(args.store))
    if not store.exists():
        raise StoreError(f"no store at {store.root} to push")
    progress = ProgressLine(f"pushing to {url}")
    try:
        r = push(store, objects, progress=progress)
    finally:
        progress.finish()
    rate = r.bytes_uploaded / r.seconds / 1e6 if r.seconds else 0.0
    if r.published:
        print(f"pushed to {url}: generation {r.generation}, {r.chunks_uploaded} new chunk(s) in "
              f"{r.objects_uploaded} pack object(s), {human_bytes(r.bytes_uploaded)} uploaded ({rate:.1f} MB/s)"
              + (f", {r.objects_reused} left by an interrupted push reused" if r.objects_reused else "")
              + f"; the snapshot names {r.chunks_total} chunk(s), {human_bytes(r.stored_bytes)}; {r.seconds:.1f} s")
    else:
        print(f"{url} is up to date: generation {r.generation} has every model of this store")
    if args.prune:
        p = prune(objects, args.grace)
        print(f"pruned {url}: {p.objects_deleted} pack object(s) and {p.snapshots_deleted} snapshot(s) deleted "
              f"({human_bytes(p.bytes_deleted)}); {p.snapshots_kept} snapshot(s) kept (current, or younger than "
              f"{args.grace:g} s)")
    return 0


def _no_remote() -> str:
    raise StoreError("give the remote: lmz push s3://BUCKET/PREFIX (or set remote = \"...\" in the config)")


def add_push_command(cmd) -> None:
    from lmzfs.store.remote.prune import DEFAULT_GRACE_S
    sp = cmd("push", cmd_push, "upload what a remote store lacks and publish this store's models there "
                               "(docs/remote.md)")
    sp.add_argument("remote", nargs="?", metavar="REMOTE", help="s3://BUCKET/PREFIX (default: the config's remote)")
    sp.add_argument("--prune", action="store_true",
                    help="then delete what no snapshot younger than --grace (or the current one) names")
    sp.add_argument("--grace", type=_duration, default=DEFAULT_GRACE_S, metavar="SECONDS",
                    help="with --prune: keep snapshots this young, and what they name (default 1h)")


# -- stats --remote -----------------------------------------------------------------------------

def remote_summary(options, as_json: bool = False) -> list[str]:
    """What `lmz stats --remote` prints: the snapshot, its models and bytes, and this host's cache."""
    import json
    archive = open_remote(options, workers=0)
    try:
        snap = archive.current_snapshot
        totals = archive.totals()
        doc = {"url": str(archive.url), "generation": snap.pointer.generation, "published": snap.pointer.written,
               "models": len({e.model for e in archive.files()}), "files": totals.files,
               "logical_bytes": totals.logical_bytes, "stored_bytes": totals.stored_bytes,
               "pack_objects": len(snap.manifest.packs), "cache_dir": str(archive.cache_dir),
               "cache_bytes": archive.blocks.size_bytes, "cache_capacity_bytes": archive.blocks.capacity}
    finally:
        archive.close()
    if as_json:
        return [json.dumps(doc, indent=1)]
    age = time.time() - doc["published"]
    return [
        f"remote {doc['url']}: generation {doc['generation']}, published {age:.0f} s ago",
        f"  {doc['models']} model(s), {doc['files']} file(s), {human_bytes(doc['logical_bytes'])} of model files in "
        f"{doc['pack_objects']} pack object(s), {human_bytes(doc['stored_bytes'])}",
        f"  cache {doc['cache_dir']}: {human_bytes(doc['cache_bytes'])} of {human_bytes(doc['cache_capacity_bytes'])}",
    ]


def print_lines(lines: list[str]) -> None:
    for line in lines:
        print(printable(line))
    sys.stdout.flush()


def default_cache_for(url: str) -> Path:
    from lmzfs.reader.remotearchive import default_cache_dir
    from lmzfs.store.remote.objects import RemoteURL
    return default_cache_dir(RemoteURL.parse(url))
