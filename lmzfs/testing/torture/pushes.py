"""crashes, the `push` writer: kill -9 of `lmz push REMOTE` against a real S3 engine (SeaweedFS
on 127.0.0.1, lmzfs/testing/seaweed.py) at a random named point of its phases (a record handed to
a pack object's upload, a pack object written before its index, a pack object and its index
written, the snapshot written before the pointer, the pointer switched), at a random moment
after one of them (the writer going on past it), or after a random delay. (There are no
multipart parts to kill between: obstore sends a create-only PUT as one request, whatever its
size, so a pack object appears whole or not at all.)

Each case has a remote of its own (a fresh prefix of the engine's bucket). An uninterrupted push
of the prepared store publishes the previous snapshot; then a push of the next store (the
prepared one with a model added, a recoding add that gives pushed chunks new payloads, and a
model removed) is killed, in some cases two or three times in a row, or, in a fifth of the
cases, the first push to an empty remote is; in a quarter, the pushes are `lmz push --prune
--grace 0`, and after the one that completes the remote must hold only what its snapshot names.
After the kills: the pointer names the previous
snapshot or the new one (the new one only if a kill came after its switch; on an empty remote,
none or the new one), and every file of every model that snapshot holds reads back byte for byte
through the remote (its SHA-256 against the source file's); `lmz verify --remote` is clean; the
push run again completes, leaves nothing in the temporary directory (what the killed pushes left
there included; a directory a push was killed while making, which holds no catalog copy, goes
once it is a minute old: store/remote/scratch.py), and the new snapshot serves, read back and verified the same way.

obstore (the object-store client) hangs in a process forked after it was used: the engine runs
as a subprocess started by the torture run (`start_engine`), and a case uses obstore only after
its last fork (the uninterrupted push and the killed one run in forked children)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lmzfs.testing.torture import Outcome
from lmzfs.testing.torture.common import (check_killed, check_ran, exit_with_lmz, fork_writer_and_kill,
                                          fresh_copy, lmz, model_of)
from lmzfs.testing.torture.prepared import Prepared, _lmz

# the named points of `lmz push` (lmzfs/killpoints.py), and "delay": a kill after a random delay
POINTS = ("push-record", "push-data", "push-object", "push-snapshot", "push-published", "delay")
ADDED, RECODED, REMOVED = "newcomer", "run/step-3", "quire-next"
START_TIMEOUT = 120.0


# -- the engine -----------------------------------------------------------------------------------

def engine_available() -> bool:
    from lmzfs.testing.seaweed import weed_binary
    return weed_binary() is not None


def start_engine(root: Path) -> subprocess.Popen:
    """Start a SeaweedFS engine in a subprocess of its own (`python -m lmzfs.testing.seaweed`:
    this process never touches obstore, so the workers it forks may) and put the client's
    environment into os.environ, for every process forked or started after. Stop it with
    stop_engine; it also stops by itself when this process dies."""
    root.mkdir(parents=True, exist_ok=True)
    env_file = root / "client.env"
    proc = subprocess.Popen([sys.executable, "-m", "lmzfs.testing.seaweed", str(root / "engine"),
                             "--env-file", str(env_file)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(root / "engine.err", "ab"))
    deadline = time.monotonic() + START_TIMEOUT
    while not env_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_engine(proc)
            raise RuntimeError(f"the S3 engine for the push cases did not start; see {root / 'engine.err'}")
        time.sleep(0.2)
    for line in env_file.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            os.environ[key] = value
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        os.environ.pop(key, None)
    return proc


def stop_engine(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the stores -----------------------------------------------------------------------------------

def next_store(prep: Prepared) -> Path:
    """The prepared store with ADDED added, RECODED added (recoding the pushed run/step-2 as a
    delta against it: chunks the remote has, with new payloads) and REMOVED removed; built once
    a run, by whichever worker comes first."""
    dest = prep.root / "push-next"
    with open(prep.root / "push-next.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (prep.root / "push-next.ready").exists():
            tmp = prep.root / "push-next.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(prep.store, tmp, symlinks=True)
            _lmz(tmp, "add", str(prep.sources[ADDED]), "--name", ADDED)
            _lmz(tmp, "add", str(prep.sources[RECODED]), "--name", RECODED)
            _lmz(tmp, "rm", REMOVED)
            tmp.rename(dest)
            (prep.root / "push-next.ready").touch()
    return dest


def expected_before(prep: Prepared) -> dict[str, str]:
    return dict(prep.expected)


def expected_after(prep: Prepared) -> dict[str, str]:
    out = {k: v for k, v in prep.expected.items() if model_of(k) != REMOVED}
    out.update(prep.spare[ADDED])
    out.update(prep.spare[RECODED])
    return out


# -- a case ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kill:
    point: str          # a named point (NAME:N), or "delay"
    delay: float        # seconds after the point (or after the start, for "delay")
    go_on: bool         # the writer goes on past the point instead of waiting there for its kill

    def __str__(self) -> str:
        return f"{self.point}{' going on' if self.go_on else ''} +{self.delay:.3f}s"


def push_case(prep: Prepared, scratch: Path, kills: list[Kill], first: bool = False, prune: bool = False) -> Outcome:
    """kills: the pushes killed one after the other (each of the next store, to the same remote)
    before the checks and the push that completes; first: the remote has no snapshot before them;
    prune: those pushes and the one that completes are `lmz push --prune --grace 0`, and after it
    the remote holds only what its snapshot names."""
    out = Outcome(f"crash push {'--prune ' if prune else ''}{'(the first) ' if first else ''}at "
                  + ", then ".join(map(str, kills)), items=len(kills))
    if prune:
        out.info["push cases with --prune"] = 1
    out.info["push cases of kills in a row" if len(kills) > 1 else "push cases of one kill"] = 1
    if first:
        out.info["push cases on an empty remote"] = 1
    nxt = next_store(prep)
    scratch = scratch / "push"             # this case's alone: its stores and cache directories
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    store = fresh_copy(nxt, scratch / "store")
    temp = scratch / "tmp"          # where the pushes keep their catalog copies (this process and its forks)
    temp.mkdir()
    tempfile.tempdir = str(temp)
    bucket = os.environ.get("S3_BUCKET", "models")
    url = f"s3://{bucket}/torture/{secrets.token_hex(6)}"
    out.info["remote"] = url
    if not first:
        # the previous snapshot, pushed in a child: this process keeps off obstore until its forks are done
        base = fresh_copy(prep.store, scratch / "base")
        rc, err = forked_lmz(base, ["push", url], scratch / "base-push.err")
        if rc != 0:
            out.problems.append(f"the push of the previous snapshot failed (rc={rc}): {err.strip()[-300:]}")
            return out
    argv = ["push", url, *(["--prune", "--grace", "0"] if prune else [])]
    reached = False
    for i, k in enumerate(kills):           # each a fork, before this process first uses obstore
        killed = fork_writer_and_kill(store, argv, point=None if k.point == "delay" else k.point,
                                      delay=k.delay, stderr_path=scratch / f"writer-{i}.err", go_on=k.go_on)
        reached |= killed.reached
        if not check_killed(out, killed, "push", k.point, timed=i == 0):
            return out
    out.info["killed"] = int(reached)
    out.info["finished_first"] = int(not reached)
    before, after = ({None: {}} if first else {1: expected_before(prep)}), expected_after(prep)
    new = 1 if first else 2
    try:
        # after the kills: a complete snapshot serves, the previous one or (published) the new one
        generation = _check_remote(out, url, scratch / "cache-kill", {**before, new: after}, "after the kill")
        if reached:
            out.info["push killed before publish" if generation != new else "push killed after publish"] = 1
        if generation is not None:
            check_ran(out, lmz(store, "verify", "--remote", url, "--cache-dir", str(scratch / "verify-kill")),
                      "verify --remote after the kill")
        # the push again: it completes, and the new snapshot serves
        again = lmz(store, *argv)
        check_ran(out, again, "the push again")
        if b"left by an interrupted push reused" in again.stdout:
            out.info["push reruns reusing uploads"] = 1
        left = sorted(p.name for p in temp.iterdir() if not _being_made(p))
        if left:
            out.problems.append(f"the push again left {left[:3]} in the temporary directory")
        _check_remote(out, url, scratch / "cache-again", {new: after}, "after the push again")
        if prune:
            _check_pruned(out, url)
        check_ran(out, lmz(store, "verify", "--remote", url, "--cache-dir", str(scratch / "verify-again")),
                  "verify --remote after the push again")
    finally:
        forget_remote(url)
    return out


def forked_lmz(store: Path, argv: list[str], stderr_path: Path, bound: float = 120.0) -> tuple[int, str]:
    """`lmz ARGV` run to its end in a forked child: (its status, its stderr)."""
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(err, 2)
            exit_with_lmz(store, argv)
        finally:
            os._exit(71)
    deadline = time.monotonic() + bound
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9, f"ran past {bound:.0f} s"
        time.sleep(0.02)
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return rc, stderr_path.read_text(errors="replace") if stderr_path.exists() else ""


def _check_remote(out: Outcome, url: str, cache: Path, snapshots: dict[int | None, dict[str, str]],
                  when: str) -> int | None:
    """Read every file of the snapshot the pointer names through the remote; count wrong bytes and
    lost models against what that snapshot must hold (snapshots: generation -> MODEL/PATH ->
    SHA-256; None: no pointer yet). Returns the generation served (None: no pointer)."""
    from lmzfs.reader.remotearchive import RemoteArchive, RemoteOptions
    from lmzfs.store.layout import StoreError
    from lmzfs.store.remote.objects import ObjectStore, RemoteURL
    from lmzfs.store.remote.snapshots import read_pointer
    if None in snapshots:
        try:
            if read_pointer(ObjectStore(RemoteURL.parse(url), timeout=30)).pointer is None:
                return None
        except StoreError as exc:
            out.problems.append(f"{when}: the pointer cannot be read: {exc}")
            return None
    try:
        archive = RemoteArchive(RemoteOptions(url, cache_dir=cache, poll_s=0, timeout_s=30), workers=0)
    except StoreError as exc:
        out.problems.append(f"{when}: the remote cannot be opened: {exc}")
        out.models_lost = max(out.models_lost, len({model_of(k) for e in snapshots.values() for k in e}))
        return None
    try:
        generation = archive.current_snapshot.pointer.generation
        want = snapshots.get(generation)
        if want is None:
            out.problems.append(f"{when}: the pointer names generation {generation}, not one of {sorted(snapshots)}")
            return generation
        served, refused = {}, {}
        for e in archive.files():
            key = f"{e.model}/{e.path}"
            h = hashlib.sha256()
            try:
                with archive.open(e) as r:
                    for off in range(0, e.size, 1 << 22):
                        h.update(r.pread(off, 1 << 22))
            except OSError as exc:
                refused[key] = str(exc)[:200]
                continue
            served[key] = h.hexdigest()
        wrong = [k for k, v in served.items() if k in want and v != want[k]]
        out.wrong_bytes += len(wrong)
        lost = {model_of(k) for k in want if served.get(k) != want[k]}
        extra = sorted(k for k in {*served, *refused} if k not in want)
        if extra:
            out.problems.append(f"{when}: generation {generation} serves files it should not: {extra[:3]}")
        if lost:
            out.models_lost = max(out.models_lost, len(lost))
            out.info["lost"] = sorted(lost)
            out.info["refused"] = dict(list(refused.items())[:3])
        if wrong:
            out.info["wrong"] = wrong[:5]
        return generation
    finally:
        archive.close()


def _check_pruned(out: Outcome, url: str) -> None:
    """After `lmz push --prune --grace 0`: the remote holds the pointer, its snapshot and the pack
    objects (with their indexes) that the snapshot names, and nothing else."""
    from lmzfs.store.remote.format import POINTER_KEY, index_key
    from lmzfs.store.remote.objects import ObjectStore, RemoteURL
    from lmzfs.store.remote.snapshots import fetch_snapshot, read_pointer
    objects = ObjectStore(RemoteURL.parse(url), timeout=30)
    pointer = read_pointer(objects).pointer
    manifest, _ = fetch_snapshot(objects, pointer)
    want = {POINTER_KEY, pointer.snapshot} | {k for p in manifest.packs.values() for k in (p.key, index_key(p.key))}
    have = {o.key for o in objects.list("")}
    if have - want:
        out.problems.append(f"push --prune --grace 0 left {len(have - want)} object(s) no snapshot names: "
                            f"{sorted(have - want)[:3]}")
    if want - have:
        out.problems.append(f"push --prune --grace 0 deleted what the snapshot names: {sorted(want - have)[:3]}")


def forget_remote(url: str) -> None:
    """Delete the case's remote (the engine's disk is not the point)."""
    from lmzfs.store.remote.objects import ObjectStore, RemoteError, RemoteURL
    with contextlib.suppress(RemoteError):
        objects = ObjectStore(RemoteURL.parse(url), timeout=10)
        keys = [o.key for o in objects.list("")]
        for i in range(0, len(keys), 500):
            objects.delete(keys[i:i + 500])


# -- drawing cases --------------------------------------------------------------------------------

def draw(rng: random.Random, learned_seconds: float | None) -> tuple[list[Kill], bool, bool]:
    """(the kills, whether the remote starts empty, whether the pushes prune): one kill, or in a
    quarter of the cases two or three in a row (the later pushes finding what the earlier ones
    left); in a fifth, on a remote nothing was pushed to before; in a quarter, with --prune."""
    n = 1 if rng.random() < 0.75 else rng.choice((2, 3))
    return [draw_kill(rng, learned_seconds) for _ in range(n)], rng.random() < 0.2, rng.random() < 0.25


def draw_kill(rng: random.Random, learned_seconds: float | None) -> Kill:
    """A named point (the Nth time it is reached) where the writer waits for its kill, or goes
    on and is killed up to 30 ms later; or a delay within the push's run."""
    point = rng.choice(POINTS)
    if point == "delay":
        return Kill(point, rng.uniform(0, learned_seconds or 0.5), False)
    if point == "push-record":          # the next store's push moves 8 chunks in 3 pack objects
        point = f"{point}:{rng.randint(1, 8)}"
    elif point in ("push-data", "push-object"):
        point = f"{point}:{rng.randint(1, 3)}"
    go_on = rng.random() < 0.5
    return Kill(point, rng.uniform(0, 0.03) if go_on else 0.0, go_on)


def _being_made(path: Path) -> bool:
    """A directory a push was killed while making (still under its first name, its lock file
    alone): the next push removes it once it is MADE_SECONDS old, as a push making one now is not."""
    from lmzfs.store.remote.scratch import LOCK, MADE_SECONDS, PREFIX
    try:
        return (path.name.startswith("." + PREFIX) and [p.name for p in path.iterdir()] == [LOCK]
                and time.time() - path.stat().st_mtime < MADE_SECONDS)
    except OSError:
        return False
