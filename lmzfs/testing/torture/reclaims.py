"""crashes, writer `mount-reclaim`: kill -9 of a writable mount while it reclaims dead pack bytes
by itself (fsmodel/reclaim.py). A first mount rewrites files many times, each version committed,
with a floor that keeps their dead versions on disk (once per worker: each case starts from a copy
of what it left); a second mount, with a reclaim floor low enough to start at once and
nothing written through it, so that the only pack session it runs is the reclaim's, is killed at a
random named point of that session (lmzfs/killpoints.py) or after a random delay. After each kill:
verify clean and every file byte-identical, a third mount finishes the reclaim, then verify and
every file again."""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

from lmzfs.testing.torture import Outcome
from lmzfs.testing.torture.common import (check_ran, count_read_back, fresh_copy, keep_mount_traceback, lmz,
                                          mount_failed, read_all, sha, unmount_quietly)
from lmzfs.testing.torture.prepared import Prepared

FILES = 4                       # files rewritten by the first mount
FILE_BYTES = 1 << 20
REWRITES = 12                   # commits of each: 11 dead versions apiece
LOW_FLOOR = str(256 << 10)      # the reclaiming mounts' --reclaim-floor
POINTS = ("append", "session-sealed", "session-commit", "session-committed", "delay")


def reclaim_case(prep: Prepared, scratch: Path, point: str, delay: float) -> Outcome:
    """One kill of a mount during its reclaim; `killed` counts it only if the reclaim had begun."""
    from lmzfs.testing.mount import mounted
    mnt = scratch / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    out = Outcome(f"crash mount-reclaim at {point} +{delay:.2f}s", info={"killed": 0})
    try:
        base, written = _dead_versions(prep, scratch)
        store = fresh_copy(base, scratch / "store")
        expected = {**prep.expected, **written}
        env = {"LMZ_KILL_AT": point} if point != "delay" else {}
        with mounted(mnt, store, "--writable", "--reclaim-floor", LOW_FLOOR, timeout=30, env=env) as fs:
            if point == "delay":
                time.sleep(delay)
                out.info["killed"] = int("reclaimed " not in fs.log())
            else:
                deadline = time.monotonic() + 60
                while "HERE" not in fs.log() and time.monotonic() < deadline and fs.process.poll() is None:
                    time.sleep(0.02)
                out.info["killed"] = int("HERE" in fs.log())
                if not out.info["killed"]:      # the point is not on this reclaim's way (e.g. append:6)
                    out.info["point_missed"] = 1
            finished_first = "reclaimed " in fs.log()
            fs.process.kill()
            fs.process.wait()
            keep_mount_traceback(out, fs)
        unmount_quietly(mnt)
        _after(out, store, expected, "after the kill")
        with mounted(mnt, store, "--writable", "--reclaim-floor", LOW_FLOOR, timeout=30) as fs:
            deadline = time.monotonic() + (0 if finished_first else 30)
            while "reclaimed " not in fs.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            if "reclaimed " not in fs.log() and not finished_first:
                out.problems.append("the mount after the kill did not reclaim the dead bytes")
            keep_mount_traceback(out, fs)
    except AssertionError as exc:
        return mount_failed(out, exc)
    finally:
        unmount_quietly(mnt)
    _after(out, store, expected, "after the reclaim")
    return out


def _dead_versions(prep: Prepared, scratch: Path) -> tuple[Path, dict[str, str]]:
    """The prepared store after a first mount rewrote FILES files REWRITES times, each version
    committed (its default floor keeps the dead versions on disk), and the digests of the files as
    they stand: made once per worker's scratch directory (built aside, then renamed into place)."""
    from lmzfs.testing.mount import mounted, wait_committed
    base = scratch / "reclaim-base"
    if (base / "written.json").exists():
        return base / "store", json.loads((base / "written.json").read_text())
    building = scratch / "reclaim-base.tmp"
    shutil.rmtree(building, ignore_errors=True)
    store = fresh_copy(prep.store, building / "store")
    mnt = building / "mnt"
    mnt.mkdir()
    rng = random.Random(48)
    files = [bytearray(rng.randbytes(FILE_BYTES)) for _ in range(FILES)]
    try:
        with mounted(mnt, store, "--writable", "--reclaim-floor", str(1 << 30), timeout=30):
            (mnt / "wr").mkdir()
            for _ in range(REWRITES):
                for n, data in enumerate(files):
                    at = rng.randrange(FILE_BYTES)
                    data[at:at + 4096] = rng.randbytes(min(4096, FILE_BYTES - at))
                    (mnt / "wr" / f"f{n}.bin").write_bytes(data)
                # each version committed before the next is written (commits run in the background:
                # a version written over before its commit never reaches the packs, nor dies there)
                wait_committed(store)
    finally:
        unmount_quietly(mnt)
    written = {f"wr/f{n}.bin": sha(bytes(data)) for n, data in enumerate(files)}
    (building / "written.json").write_text(json.dumps(written))
    shutil.rmtree(base, ignore_errors=True)
    os.replace(building, base)
    return base / "store", written


def _after(out: Outcome, store: Path, expected: dict[str, str], when: str) -> None:
    check_ran(out, lmz(store, "verify"), f"verify {when}")
    count_read_back(out, read_all(store, expected), expected)


def random_reclaim_case(rng: random.Random) -> tuple[str, float]:
    point = rng.choice(POINTS)
    if point == "append":
        point = f"append:{rng.randint(1, 6)}"
    delay = rng.uniform(0.5, 2.0) if point == "delay" else 0.0    # it starts ~1 s after the mount
    return point, delay
