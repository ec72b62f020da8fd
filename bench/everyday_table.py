"""The writable mount for everyday work (issue 47), beside ext4 in the same run.

Each row runs the same program twice: into a writable mount of a fresh store (`lmz mount
--writable`) and into a plain directory on the same disk (the "ext4" column: the file system the
bench's temporary directory lies on). The mount's time is the program's own (what the person
running it waits for); where the mount then still commits in the background, the time until its
spool holds no record is given beside it (`then_committed_s`). The rows that make many files
(rsync, small files) also run into the pyfuse3 floor (`pyfuse_floor.py`: an in-memory file system
whose handlers do next to nothing), which shows what any pyfuse3 + trio daemon costs here. Every
timed program starts after `sync`, and what a round made is removed only at the end, so that no
side's time includes writing back what another, or an earlier round and its removal, left.

- rsync: `rsync -a` of a tree of about 4,000 files (/usr/share/doc) into a new model directory.
- small files: 5,000 files of 100 bytes each created, written and closed by one Python process.
- appends: 20 `sh -c 'echo x >> FILE'` on a 200 MB file (stored and committed before).
- writes + subprocess: one descriptor open on that 200 MB file, 10 one-byte pwrites, each
  followed by a subprocess start (`true`: close-on-exec closes a copy of the descriptor).
- read during commit: a new 200 MB file written and closed (its commit starts), and meanwhile
  4 KiB preads at random offsets of it until the commit is done: p50, p99 and max latency.
- log space: in a fresh store of its own, a 10 MB file (random bytes) appended to 100 times
  (4 KiB of hex text each, open/append/close, each append committed before the next): the
  packs' bytes on disk against the live payload of the chunks the catalog references, and the
  file's size; no `lmz gc` run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import common
from common import ToolError, log, mounted

TREE = Path("/usr/share/doc")
SMALL_FILES = 5000
SMALL_BYTES = 100
BIG_BYTES = 200 << 20
APPENDS = 20
SUBPROCESS_WRITES = 10
READ_SIZE = 4096
LOG_BYTES = 10 << 20
LOG_APPENDS = 100
LOG_APPEND_BYTES = 4096
GOALS = {"rsync_x": 5.0, "small_files_x": 5.0, "appends_s": 0.5, "subprocess_writes_s": 0.2,
         "read_p99_ms": 20.0, "log_space_x": 1.5}


def _lmz(store: Path, *args) -> list:
    return [common.LMZFS_CLI, "--store", store, *args]


def _committed(store: Path | None, timeout: float = 1800.0) -> None:
    """Until the writable mount of `store` has committed every file (its spool holds no record)."""
    if store is None:
        return
    deadline = time.monotonic() + timeout
    while common.spool_pending(store):
        if time.monotonic() > deadline:
            raise ToolError(f"the mount of {store} did not commit its files within {timeout:.0f} s")
        time.sleep(0.005)


def _timed(fn, store: Path | None) -> tuple[float, float]:
    """(seconds fn took, seconds until the mount had then committed everything). The disk's dirty
    pages are written first (sync), so that neither file system's time includes writing back
    what the other, or the previous round and its removal, left behind."""
    os.sync()
    t0 = time.monotonic()
    fn()
    t1 = time.monotonic()
    _committed(store)
    return t1 - t0, time.monotonic() - t1


def _big_file(path: Path, size: int, seed: int) -> None:
    rnd = random.Random(seed)
    block = rnd.randbytes(1 << 20)
    with open(path, "wb") as f:
        for i in range(size >> 20):
            f.write(block[i % 256:] + block[:i % 256])


def _rsync(dest: Path) -> None:
    common.run(["rsync", "-a", f"{TREE}/", dest / "doc"], timeout=3600)


def _small_files(dest: Path) -> None:
    (dest / "small").mkdir()
    payload = b"x" * SMALL_BYTES
    for i in range(SMALL_FILES):
        with open(dest / "small" / f"f{i:05d}", "wb") as f:
            f.write(payload)


def _appends(path: Path) -> None:
    for _ in range(APPENDS):
        subprocess.run(["sh", "-c", f"echo x >> '{path}'"], check=True)


def _subprocess_writes(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        for i in range(SUBPROCESS_WRITES):
            os.pwrite(fd, b"y", i * 4096 + 7)
            subprocess.run(["true"], check=True)
    finally:
        os.close(fd)


def _reads_during(path: Path, store: Path | None, size: int) -> dict:
    """Write `path` anew and close it; read 4 KiB at random offsets until its commit is done."""
    _big_file(path, size, 7)
    latencies: list[float] = []
    rnd = random.Random(3)
    fd = os.open(path, os.O_RDONLY)
    try:
        t_end = time.monotonic() + 2.0 if store is None else None
        while True:
            off = rnd.randrange(0, size - READ_SIZE)
            t0 = time.perf_counter()
            data = os.pread(fd, READ_SIZE, off)
            latencies.append(time.perf_counter() - t0)
            if len(data) != READ_SIZE:
                raise ToolError(f"a read of {path} at {off} was short")
            if store is None:
                if time.monotonic() > t_end:
                    break
            elif not common.spool_pending(store):
                break
    finally:
        os.close(fd)
    latencies.sort()
    return {"reads": len(latencies), "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "max_ms": 1e3 * latencies[-1]}


def _log_space(dest: Path, store: Path | None) -> dict:
    path = dest / "app.log"
    _big_file(path, LOG_BYTES, 11)
    _committed(store)
    rnd = random.Random(5)
    for _ in range(LOG_APPENDS):
        with open(path, "ab") as f:
            f.write(rnd.randbytes(LOG_APPEND_BYTES // 2).hex().encode())
        _committed(store)
    out = {"file_bytes": path.stat().st_size}
    if store is not None:
        time.sleep(3.0)                 # the mount's reclaim looks at most every 2 s
        packs = sum(p.stat().st_size for p in (store / "packs").rglob("*") if p.is_file())
        db = sqlite3.connect(f"file:{store / 'catalog.sqlite'}?mode=ro", uri=True)
        try:
            live, = db.execute("SELECT COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()
        finally:
            db.close()
        out.update({"pack_bytes": packs, "live_payload_bytes": live, "catalog_bytes": sum(
            p.stat().st_size for p in store.glob("catalog.sqlite*") if p.is_file())})
    return out


def _programs(root: Path, store: Path | None) -> dict:
    """Every row's program, in `root` (a model directory of a mount, or a plain directory)."""
    row: dict = {}
    log(f"everyday: rsync -a {TREE} into {root}")
    row["rsync_s"], row["rsync_then_committed_s"] = _timed(lambda: _rsync(root), store)
    log(f"everyday: {SMALL_FILES} small files")
    row["small_files_s"], row["small_files_then_committed_s"] = _timed(lambda: _small_files(root), store)
    big = root / "big.bin"
    _big_file(big, BIG_BYTES, 1)
    _committed(store)
    log(f"everyday: {APPENDS} appends to a {BIG_BYTES >> 20} MB file")
    row["appends_s"], row["appends_then_committed_s"] = _timed(lambda: _appends(big), store)
    log(f"everyday: {SUBPROCESS_WRITES} one-byte writes with a subprocess start after each")
    row["subprocess_writes_s"], row["subprocess_writes_then_committed_s"] = _timed(lambda: _subprocess_writes(big), store)
    log("everyday: 4 KiB reads of a file during its commit")
    row["read_during_commit"] = _reads_during(root / "fresh.bin", store, BIG_BYTES)
    return row


def _many_files(root: Path, store: Path | None) -> dict:
    """The rows that create many files (rsync, small files): another round of them."""
    row: dict = {}
    log(f"everyday: again rsync -a and {SMALL_FILES} small files into {root}")
    row["rsync_s"], row["rsync_then_committed_s"] = _timed(lambda: _rsync(root), store)
    row["small_files_s"], row["small_files_then_committed_s"] = _timed(lambda: _small_files(root), store)
    return row


SIDES = ("ext4", "mount", "floor")


def _into(tmp: Path, measured, side: str) -> dict:
    """`measured(root, store)` into a fresh plain directory (ext4), a fresh writable mount's model
    (mount), or a fresh mount of the pyfuse3 floor file system (floor). Nothing is removed here:
    a removal's write-back slows the next file system to make files (measure() removes at the end)."""
    n = sum(1 for _ in tmp.glob(f"{side}-*"))
    if side == "ext4":
        plain = tmp / f"ext4-{n}"
        plain.mkdir(parents=True)
        return measured(plain, None)
    mnt = tmp / "mnt"
    if side == "floor":
        argv = [common.LMZFS_PY, Path(__file__).with_name("pyfuse_floor.py"), mnt]
        with mounted(argv, ["fusermount3", "-u", mnt], mnt, tmp / f"floor-{n}.log") as m:
            (m.path / "work").mkdir()
            return measured(m.path / "work", None)
    store = tmp / f"mount-{n}"
    with mounted(_lmz(store, "mount", "--writable", mnt), _lmz(store, "umount", mnt), mnt,
                 tmp / "mount.log") as m:
        (m.path / "work").mkdir()
        return measured(m.path / "work", store)


def measure(tmp: Path, runs: int = 1) -> dict:
    """Every row once into ext4 and the mount; the rows that create many files `runs` times in all
    into ext4, the mount and the pyfuse3 floor in turn (which goes first rotating). The time ext4
    takes to make files here swings from run to run, several-fold (other work on the disk, the
    write-back of earlier rounds): the ratios judged against the goals are of each side's quickest
    run (the least disturbed), the medians are shown beside them."""
    files = sum(len(f) for _, _, f in os.walk(TREE))
    res: dict = {"tree": str(TREE), "tree_files": files, "goals": GOALS}
    try:
        res["ext4"] = _into(tmp, _programs, "ext4")
        res["mount"] = _into(tmp, _programs, "mount")
        many = ("rsync_s", "rsync_then_committed_s", "small_files_s", "small_files_then_committed_s")
        rounds = [{side: {k: res[side][k] for k in many} for side in ("ext4", "mount")}]
        rounds[0]["floor"] = _into(tmp, _many_files, "floor")
        for r in range(1, runs):
            order = SIDES[r % 3:] + SIDES[:r % 3]
            rounds.append({side: _into(tmp, _many_files, side) for side in order})
        res["rounds"] = rounds
    finally:
        for path in [*tmp.glob("ext4-*"), *tmp.glob("mount-*")]:
            shutil.rmtree(path, ignore_errors=True)
    log(f"everyday: {LOG_APPENDS} appends to a {LOG_BYTES >> 20} MB log, in a store of its own")
    store, mnt = tmp / "log-store", tmp / "mnt"
    with mounted(_lmz(store, "mount", "--writable", mnt), _lmz(store, "umount", mnt), mnt, tmp / "mount.log") as m:
        (m.path / "work").mkdir()
        res["log_space"] = _log_space(m.path / "work", store)
    shutil.rmtree(store, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--lmz", type=Path, help="the lmz CLI to mount with")
    ap.add_argument("--tmpdir", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=1, help="rounds of the rows that create many files")
    args = ap.parse_args(argv)
    if args.lmz is not None:
        common.LMZFS_CLI = args.lmz
    work = args.tmpdir / "everyday"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        res = measure(work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
