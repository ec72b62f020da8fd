"""crashes: kill -9 of each writer (add, recoding add, rm, gc, each rewrite pass, verify
--repair, a writable mount's commit and its background reclaim, reclaims.py) at a random named
kill point (lmzfs/killpoints.py: append:N, session-sealed, session-commit, session-committed) or
after a random delay. After
each: verify clean, every model byte-identical to its original or absent (absent only for the
model the killed command adds or removes), then the command again, which must complete.
`lmz push` to a real S3 engine is killed the same way (pushes.py), and so is a remote mount while it
fetches, its disk cache then damaged (remotecache.py)."""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Iterator

from lmzfs.testing.torture import Case, Outcome, pushes, remotecache
from lmzfs.testing.torture.common import (check_killed, check_ran, count_read_back, fork_writer_and_kill,
                                          fresh_copy, keep_mount_traceback, listed_models, lmz, model_of,
                                          mount_failed, read_all, sha, unmount_quietly)
from lmzfs.testing.torture.prepared import Prepared
from lmzfs.testing.torture.reclaims import random_reclaim_case, reclaim_case

POINTS = ("append", "session-sealed", "session-commit", "session-committed", "delay")
WRITERS = ("add", "recoding-add", "rm", "gc", "compact", "recode", "delta", "anchor", "repair", "mount-commit",
           "mount-reclaim", "push", "remote-mount")
ENGINE_WRITERS = ("push", "remote-mount")     # those that need the S3 engine the run starts
PUSH_SAMPLE = 3             # push cases in the short sample (one of every other writer)


def writer_argv(prep: Prepared, writer: str) -> tuple[list[str], str | None]:
    """The command, and the model it adds or removes (which may be absent after the kill)."""
    src = prep.sources
    return {
        "add": (["add", str(src["newcomer"]), "--name", "newcomer"], "newcomer"),
        "recoding-add": (["add", str(src["run/step-3"]), "--name", "run/step-3"], "run/step-3"),
        "rm": (["rm", "quire-next"], "quire-next"),
        "gc": (["gc"], None),
        "compact": (["rewrite", "compact", "--all"], None),
        "recode": (["rewrite", "recode"], None),
        "delta": (["rewrite", "delta", "solo", "--base", "run/step-2"], None),
        "anchor": (["rewrite", "anchor", "run/step-1"], None),
        "repair": (["verify", "--repair"], None),
    }[writer]


def crash_case(prep: Prepared, scratch: Path, writer: str, point: str, delay: float) -> Outcome:
    """One kill of `writer`; its outcome counts the case under the writer (`cases WRITER`) and,
    if the kill came before the writer ended, the kill (`killed WRITER`)."""
    return counted(_crash_case(prep, scratch, writer, point, delay), writer)


def counted(out: Outcome, writer: str) -> Outcome:
    out.info[f"cases {writer}"] = 1
    out.info[f"killed {writer}"] = int(out.info.pop("killed", 0))
    return out


def _crash_case(prep: Prepared, scratch: Path, writer: str, point: str, delay: float) -> Outcome:
    if writer == "mount-commit":
        return mount_commit_case(prep, scratch, point, delay)
    if writer == "mount-reclaim":
        return reclaim_case(prep, scratch, point, delay)
    store = fresh_copy(prep.store, scratch / "store")
    argv, subject = writer_argv(prep, writer)
    out = Outcome(f"crash {writer} at {point} +{delay:.2f}s")
    if writer == "repair":      # something to repair: a zeroed page of the catalog
        rng = random.Random(hash((point, delay)))
        cat = store / "catalog.sqlite"
        at = rng.randrange(cat.stat().st_size // 4096) * 4096
        with open(cat, "r+b") as f:
            f.seek(at)
            f.write(bytes(4096))
        out.name += f" (catalog page {at // 4096} zeroed)"
    killed = fork_writer_and_kill(store, argv, point=None if point == "delay" else point, delay=delay,
                                  stderr_path=scratch / "writer.err")
    out.info["killed"] = int(killed.reached)
    out.info["finished_first"] = int(killed.finished)
    if not check_killed(out, killed, "writer", point):
        return out
    expected = dict(prep.expected)
    adds = {"newcomer": prep.spare["newcomer"], "run/step-3": prep.spare["run/step-3"]}
    if subject in adds:
        expected.update(adds[subject])
    if writer == "repair":
        check_ran(out, lmz(store, *argv), "the repair again")
    # after the kill: verify clean, every model right or (the subject) absent
    check_ran(out, lmz(store, "verify"), "verify after the kill")
    present = listed_models(store) or set()
    check = {k: v for k, v in expected.items() if model_of(k) != subject or subject in present}
    rb = read_all(store, check)
    count_read_back(out, rb, check)
    # the command again: it completes
    if writer == "add" or writer == "recoding-add":
        if subject not in present:
            check_ran(out, lmz(store, *argv), "the add again")
    elif writer == "rm":
        if subject in present:
            check_ran(out, lmz(store, *argv), "the rm again")
        expected = {k: v for k, v in expected.items() if model_of(k) != subject}
    elif writer != "repair":
        check_ran(out, lmz(store, *argv), f"{' '.join(argv)} again")
    check_ran(out, lmz(store, "verify"), "verify after the rerun")
    rb = read_all(store, expected)
    count_read_back(out, rb, expected)
    if writer == "rm" and subject in (listed_models(store) or set()):
        out.problems.append("the removed model is still listed after rm again")
    return out


def mount_commit_case(prep: Prepared, scratch: Path, mode: str, delay: float) -> Outcome:
    """Copy a file into a writable mount; kill -9 the daemon mid-copy, right after fsync, or
    while close() commits it; remount: the file is whole if fsync'd, else absent or a prefix of
    what was written; copy it again; verify clean, every model right."""
    from lmzfs.testing.mount import mounted
    store = fresh_copy(prep.store, scratch / "store")
    mnt = scratch / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    data = (prep.sources["newcomer"] / "model.safetensors").read_bytes()
    digest = sha(data)
    rng = random.Random(int(delay * 1e6))
    out = Outcome(f"crash mount-commit {mode} +{delay:.2f}s", info={"killed": 1})
    cut = len(data) if mode != "mid-copy" else rng.randrange(1, len(data))
    fsynced = mode != "mid-copy"
    try:
        with mounted(mnt, store, "--writable", timeout=30) as fs:
            (mnt / "wm").mkdir()
            fd = os.open(mnt / "wm" / "f.bin", os.O_CREAT | os.O_WRONLY)
            for at in range(0, cut, 1 << 17):
                os.write(fd, data[at:min(cut, at + (1 << 17))])
            closer = None
            if fsynced:
                os.fsync(fd)
            if mode == "during-close":
                closer = threading.Thread(target=lambda: _close(fd))
                closer.start()
            time.sleep(delay)
            fs.process.kill()
            fs.process.wait()
            if closer is not None:
                closer.join()
            else:
                _close(fd)
        unmount_quietly(mnt)
        with mounted(mnt, store, "--writable", timeout=30) as fs:
            f = mnt / "wm" / "f.bin"
            got = f.read_bytes() if f.exists() else None
            if got is not None and data[:len(got)] != got:
                out.wrong_bytes += 1
                out.info["file"] = f"wrong ({len(got)} bytes)"
            elif fsynced and got != data:
                out.models_lost += 1
                out.info["file"] = "fsync'd but " + ("absent" if got is None else f"{len(got)} of {len(data)} bytes")
            (mnt / "wm").mkdir(exist_ok=True)
            f.write_bytes(data)         # the copy again
            keep_mount_traceback(out, fs)
    except AssertionError as exc:
        return mount_failed(out, exc)
    finally:
        unmount_quietly(mnt)
    check_ran(out, lmz(store, "verify"), "verify after the remount")
    expected = {**prep.expected, "wm/f.bin": digest}
    count_read_back(out, read_all(store, expected), expected)
    return out


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# How long each writer ran when it ended before its kill (this worker's cases): a kill after a
# random delay then falls inside the run, not after it.
_DURATIONS: dict[str, float] = {}
DELAY_ONLY = ("rm", "repair")          # writers without a pack session: no named point on their way


def note(out: Outcome) -> None:
    """Learn from a finished case (the torture worker calls this with each outcome)."""
    seconds = out.info.get("writer_seconds")
    writer = next((k.split(" ", 1)[1] for k in out.info if k.startswith("cases ")), None)
    if seconds and writer:
        before = _DURATIONS.get(writer)
        _DURATIONS[writer] = seconds if before is None else 0.7 * before + 0.3 * seconds


def random_case(prep: Prepared, scratch: Path, rng: random.Random, writer: str) -> Case:
    if writer == "remote-mount":
        delay, flips, seed = remotecache.draw(rng, _DURATIONS.get(writer))
        return Case(f"crash remote-mount +{delay:.2f}s, {flips} flips",
                    lambda: counted(remotecache.remote_mount_case(prep, scratch, delay, flips, seed), writer), 150)
    if writer == "push":
        kills, first, prune = pushes.draw(rng, _DURATIONS.get(writer))
        return Case(f"crash push {kills[0].point}",
                    lambda: counted(pushes.push_case(prep, scratch, kills, first, prune), writer), 150)
    if writer == "mount-commit":
        mode = rng.choice(("mid-copy", "after-fsync", "during-close"))
        delay = rng.uniform(0, 0.3)
        return Case(f"crash mount-commit {mode}", lambda: crash_case(prep, scratch, writer, mode, delay), 150)
    if writer == "mount-reclaim":
        point, delay = random_reclaim_case(rng)
        return Case(f"crash mount-reclaim {point}", lambda: crash_case(prep, scratch, writer, point, delay), 150)
    point = "delay" if writer in DELAY_ONLY else rng.choice(POINTS)
    if point == "append":
        point = f"append:{rng.randint(1, 6)}"
    elif point != "delay" and rng.random() < 0.3:
        point = f"{point}:{rng.randint(1, 2)}"
    delay = rng.uniform(0, _DURATIONS.get(writer, 1.0)) if point == "delay" else \
        (rng.uniform(0, 0.05) if rng.random() < 0.2 else 0.0)
    return Case(f"crash {writer} {point}", lambda: crash_case(prep, scratch, writer, point, delay), 150)


def cases(prep: Prepared, scratch: Path, rng: random.Random, sample: bool,
          writers: tuple[str, ...] = WRITERS) -> Iterator[Case]:
    """Cases of `writers` in turn (the push and remote-mount writers need the engine that the run
    started: pushes.start_engine). The sample: one case of each, PUSH_SAMPLE of push."""
    if sample:
        for writer in writers:
            for _ in range(PUSH_SAMPLE if writer == "push" else 1):
                yield random_case(prep, scratch, rng, writer)
        return
    while True:
        for writer in writers:
            yield random_case(prep, scratch, rng, writer)
