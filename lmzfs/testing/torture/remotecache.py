"""crashes, the remote mount's disk cache: kill -9 of `lmz mount --remote` (against the run's real
S3 engine, pushes.start_engine) while a reader reads every file through it, at a random moment of
its fetches; then random bits flipped anywhere in the cache's object files (headers, slot
tables, blocks, holes: lmzfs/store/remote/blockcache.py), as a disk or a power cut might; then a
mount of the same cache reads every file again. Every byte it serves must be the original's,
no file may be refused (the engine is up: a damaged block is fetched again, never served or
turned into EIO), and the daemon logs no traceback. Each case pushes the prepared store to a
remote of its own (a fresh prefix) in a forked child, and deletes it at the end."""
from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from lmzfs.testing.torture import Outcome
from lmzfs.testing.torture.common import fresh_copy, keep_mount_traceback, model_of, mount_failed, unmount_quietly
from lmzfs.testing.torture.prepared import Prepared


def remote_mount_case(prep: Prepared, scratch: Path, delay: float, flips: int, seed: int) -> Outcome:
    from lmzfs.testing.mount import mounted
    from lmzfs.testing.torture import pushes
    out = Outcome(f"crash remote-mount +{delay:.2f}s, then {flips} bit(s) flipped in its cache", items=1 + flips,
                  info={"cache bits flipped": flips})
    scratch = scratch / "remote-mount"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    url = f"s3://{os.environ.get('S3_BUCKET', 'models')}/torture/{secrets.token_hex(6)}"
    rc, err = pushes.forked_lmz(fresh_copy(prep.store, scratch / "store"), ["push", url], scratch / "push.err")
    if rc != 0:
        out.problems.append(f"the push of the prepared store failed (rc={rc}): {err.strip()[-300:]}")
        return out
    cache, mnt = scratch / "cache", scratch / "mnt"
    mnt.mkdir()
    args = ("--remote", url, "--cache-dir", str(cache), "--poll", "0", "--remote-timeout", "30")
    try:
        with mounted(mnt, scratch / "unused", *args, timeout=60) as fs:
            reader = subprocess.Popen(["cat", *(str(mnt / k) for k in sorted(prep.expected))],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            out.info["killed"] = int(reader.poll() is None)     # while the reader still read through it
            fs.process.kill()
            fs.process.wait()
            reader.wait(timeout=60)
        unmount_quietly(mnt)
        out.info["cache files after the kill"] = len(_object_files(cache))
        _flip_bits(cache, flips, random.Random(seed))
        with mounted(mnt, scratch / "unused", *args, timeout=60) as fs:
            t0 = time.monotonic()
            _read_back(out, mnt, prep.expected)
            out.info["writer_seconds"] = time.monotonic() - t0      # the next cases' kills fall within it
            disk = json.loads((mnt / ".lmzfs" / "stats.json").read_text())["remote"]["disk_cache"]
            out.info["cache blocks fetched again"] = disk["damaged"]
            keep_mount_traceback(out, fs)
    except AssertionError as exc:
        return mount_failed(out, exc)
    finally:
        unmount_quietly(mnt)
        pushes.forget_remote(url)
    return out


def _object_files(cache: Path) -> list[Path]:
    objects = cache / "objects"
    return sorted(p for p in objects.rglob("*") if p.is_file()) if objects.is_dir() else []


def _flip_bits(cache: Path, flips: int, rng: random.Random) -> None:
    """Flip `flips` bits, each at a random byte of a random object file of the cache."""
    files = [p for p in _object_files(cache) if p.stat().st_size > 0]
    for _ in range(flips if files else 0):
        path = rng.choice(files)
        with open(path, "r+b") as f:
            at = rng.randrange(path.stat().st_size)
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))


def _read_back(out: Outcome, mnt: Path, expected: dict[str, str]) -> None:
    """Every file through the mount against its SHA-256: a wrong one counts as wrong bytes, one
    refused (EIO) as a lost model."""
    lost, wrong = set(), []
    for key, digest in sorted(expected.items()):
        try:
            h = hashlib.sha256()
            with open(mnt / key, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
        except OSError as exc:
            lost.add(model_of(key))
            out.info.setdefault("refused", f"{key}: {exc}"[:200])
            continue
        if h.hexdigest() != digest:
            wrong.append(key)
    out.wrong_bytes += len(wrong)
    out.models_lost = max(out.models_lost, len(lost))
    if wrong:
        out.info["wrong"] = wrong[:5]


def draw(rng: random.Random, learned_seconds: float | None) -> tuple[float, int, int]:
    """(the kill's delay within the reader's run, how many bits to flip, the flips' seed)."""
    return rng.uniform(0, learned_seconds or 1.0), rng.choice((0, 1, 4, 16, 64)), rng.randrange(1 << 30)
