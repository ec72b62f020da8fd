"""Running lmzfs mounts: finding them (/proc/self/mountinfo), reading their /.lmzfs/stats.json,
and the summary `lmz stats` prints.

Reading a file of a FUSE mount blocks for as long as its server does, so stats are read in a
helper thread that is given up on after a timeout: a hung mount is reported, never waited on.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

from lmzfs.mountinfo import MOUNTINFO, Mount, mounts
from lmzfs.progress import human_bytes

FSTYPE = "fuse.lmzfs"
STATS_FILE = Path(".lmzfs") / "stats.json"


def lmzfs_mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """Every lmzfs mount in this process's mount namespace, in mount order."""
    return [m for m in mounts(mountinfo) if m.fstype == FSTYPE]


class StatsUnavailable(Exception):
    """The stats file of a mount could not be read; the message says why. *broken*: the mount
    itself is not being served (no answer, or its server is gone)."""

    def __init__(self, message: str, broken: bool = False):
        super().__init__(message)
        self.broken = broken


def read_stats(mountpoint: Path, timeout: float = 5.0) -> tuple[str, dict]:
    """(the raw text of MOUNTPOINT/.lmzfs/stats.json, its parsed content)."""
    result: dict = {}

    def read():
        try:
            result["text"] = (Path(mountpoint) / STATS_FILE).read_bytes().decode()
        except BaseException as exc:       # handed to the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=read, name=f"lmzfs-stats-{mountpoint}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise StatsUnavailable(f"{mountpoint}: no answer within {timeout:.0f}s (is its server hung?)", broken=True)
    error = result.get("error")
    if isinstance(error, FileNotFoundError):
        raise StatsUnavailable(f"{mountpoint}: no {STATS_FILE} (not an lmzfs mount, or an older one)")
    if isinstance(error, OSError):
        raise StatsUnavailable(f"{mountpoint}: cannot read {STATS_FILE}: {error.strerror or error}",
                               broken=error.errno in (errno.ENOTCONN, errno.ECONNABORTED))
    if error is not None:
        raise StatsUnavailable(f"{mountpoint}: cannot read {STATS_FILE}: {error}")
    try:
        return result["text"], json.loads(result["text"])
    except ValueError as exc:
        raise StatsUnavailable(f"{mountpoint}: {STATS_FILE} is not JSON: {exc}") from None


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def summary(mountpoint: Path, stats: dict, now: float | None = None) -> list[str]:
    """A readable summary of a stats document (missing counters read as 0)."""
    reader, cache = stats.get("reader", {}), stats.get("cache", {})
    readahead, daemon = stats.get("readahead", {}), stats.get("daemon", {})
    started = reader.get("started")
    uptime = f", up {_duration((now or time.time()) - started)}" if isinstance(started, (int, float)) else ""
    decoded, seconds = reader.get("bytes_decoded", 0), reader.get("decode_seconds", 0.0)
    rate = f", {decoded / seconds / 1e6:.1f} MB/s" if seconds else ""
    hit_rate = cache.get("hit_rate")
    ra_state = "off" if readahead.get("enabled") is False else "on"
    lines = [
        f"lmzfs mount {mountpoint} (pid {stats.get('pid', '?')}{uptime})",
        f"  served      {human_bytes(reader.get('bytes_served', 0))} ({reader.get('bytes_served', 0)} bytes)"
        + (f" in {reader['reads']} reads" if "reads" in reader else ""),
        f"  decoded     {human_bytes(decoded)} in {reader.get('chunks_decoded', 0)} chunks"
        f" and {reader.get('segments_decoded', 0)} segments (for reads needing less than a chunk), "
        f"{seconds:.2f} s of decoding{rate}",
        f"  cache       hit rate {'-' if hit_rate is None else f'{100 * hit_rate:.1f}%'} "
        f"(hits {cache.get('hits', 0)}, misses {cache.get('misses', 0)}, waits {cache.get('waits', 0)}); "
        f"holds {human_bytes(cache.get('bytes', 0))} of {human_bytes(cache.get('capacity_bytes', 0))}"
        f" (at most {human_bytes(cache.get('peak_bytes', 0))} so far)",
        f"  read-ahead  {ra_state}: {reader.get('readahead_chunks', 0)} chunks decoded ahead, "
        f"{reader.get('readahead_hits', 0)} reads served from them, "
        f"{reader.get('chunks_released', 0)} chunks released once read, "
        f"{readahead.get('active_streams', 0)} active streams",
        f"  reads       {daemon.get('reads_inline', 0)} on the event loop (decoded chunks, one cheap decode, or a lone miss), "
        f"{daemon.get('reads_threaded', 0)} in worker threads",
        f"  open files  {stats.get('open_files', 0)}, sharing {stats.get('open_packs', 0)} open pack(s)",
    ]
    corrupt = reader.get("corrupt_chunks", 0)
    lines.append(f"  corrupt     {corrupt} chunk(s)" + (" -- run `lmz verify`" if corrupt else ""))
    remote = stats.get("remote")
    if remote:
        fetch, disk = remote.get("fetch", {}), remote.get("disk_cache", {})
        mean, p99 = fetch.get("latency_ms_mean"), fetch.get("latency_ms_p99")
        lines += [
            f"  remote    {remote.get('url')}: generation {remote.get('generation')}, {remote.get('state')}",
            f"  fetched     {human_bytes(fetch.get('bytes_fetched', 0))} in {fetch.get('requests', 0)} ranged GETs"
            f" ({human_bytes(fetch.get('readahead_bytes', 0))} read ahead), {fetch.get('errors', 0)} failed; latency "
            + ("-" if mean is None else f"mean {mean:.1f} ms, p99 {p99:.1f} ms"),
            f"  disk cache  {human_bytes(disk.get('bytes', 0))} of {human_bytes(disk.get('capacity_bytes', 0))} in "
            f"{disk.get('dir')}: hits {disk.get('hits', 0)}, misses {disk.get('misses', 0)}, "
            f"{disk.get('damaged', 0)} damaged block(s) fetched again, {disk.get('evicted', 0)} evicted",
        ]
    return lines


def pick_mount(requested: Path | None, configured: Path | None) -> Path:
    """The mount `lmz stats` reports on: the one named, else the configured mountpoint, else the
    only lmzfs mount. ValueError (with a message for the user) when that is not clear."""
    if requested is not None:
        return Path(requested).absolute()
    if configured is not None:
        return Path(configured)
    mounts = lmzfs_mounts()
    if not mounts:
        raise ValueError("no lmzfs mount is active (name a MOUNTPOINT, or set mountpoint in the config)")
    if len({m.mountpoint for m in mounts}) > 1:
        names = ", ".join(str(m.mountpoint) for m in mounts)
        raise ValueError(f"several lmzfs mounts are active ({names}); name the one you mean")
    return mounts[0].mountpoint


def is_lmzfs_mount(mountpoint: Path) -> bool:
    path = os.path.abspath(mountpoint)
    return any(str(m.mountpoint) in (path, os.path.realpath(path)) for m in lmzfs_mounts())
