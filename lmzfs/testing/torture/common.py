"""What the families share: lmz run in this process with its output captured, fresh copies of
the prepared store, reading every file back through `lmz cat`, and forking a writer to kill."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import select
import shutil
import signal
import sys
import time
import traceback as tb_mod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from lmzfs.testing.torture import Outcome


@dataclass
class Ran:
    argv: tuple[str, ...]
    rc: int
    stdout: bytes
    stderr: str
    traceback: str | None

    @property
    def any_traceback(self) -> str | None:
        return self.traceback or (self.stderr if "Traceback (most recent call last)" in self.stderr else None)


def lmz(store: Path, *argv: str) -> Ran:
    """`lmz --store STORE ARGV` in this process; stdout (bytes) and stderr captured, an exception
    that escapes main() recorded as the traceback a user would see."""
    from lmzfs.cli import main
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    err = io.StringIO()
    full = ["--store", str(store), *argv]
    tb = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(full)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:       # noqa: B036 -- what a user would see as a traceback
            tb = tb_mod.format_exc()
            rc = 1
        try:
            out.flush()
        except ValueError:
            pass
    return Ran(tuple(full), rc, raw.getvalue(), err.getvalue(), tb)


def check_ran(out, ran: Ran, what: str) -> None:
    """Record on the outcome `out` a traceback the command let out and a failure (rc != 0)."""
    if ran.any_traceback and out.traceback is None:
        out.traceback = ran.any_traceback[-3000:]
    if ran.rc != 0:
        out.problems.append(f"{what}: rc={ran.rc} {ran.stderr.strip()[-300:]}")


def count_read_back(out, rb: "ReadBack", expected: dict[str, str]) -> None:
    """Record on the outcome `out` what a read-back of the `expected` files found: wrong bytes,
    the models not read back whole (lost), a traceback."""
    out.wrong_bytes += len(rb.wrong)
    if rb.tracebacks and out.traceback is None:
        out.traceback = rb.tracebacks[0][-3000:]
    lost = {model_of(k) for k in expected if k not in rb.right}
    out.models_lost = max(out.models_lost, len(lost))
    if lost:
        out.info["lost"] = sorted(lost)
        out.info["refused"] = dict(list(rb.refused.items())[:3])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fresh_copy(prepared: Path, dest: Path) -> Path:
    """A full copy of a prepared store (packs copied too: cases write and damage them)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(prepared, dest, symlinks=True)
    return dest


@dataclass
class ReadBack:
    right: set[str]             # MODEL/PATH read back byte for byte
    wrong: list[str]            # read back with other bytes: the one thing never allowed
    refused: dict[str, str]     # read gave an error (first stderr line)
    tracebacks: list[str]


def read_all(store: Path, expected: dict[str, str]) -> ReadBack:
    """`lmz cat` of every expected file, each compared with its original's SHA-256."""
    rb = ReadBack(set(), [], {}, [])
    for key, digest in expected.items():
        r = lmz(store, "cat", key)
        if r.any_traceback:
            rb.tracebacks.append(r.any_traceback)
        if r.rc == 0:
            if sha(r.stdout) == digest:
                rb.right.add(key)
            else:
                rb.wrong.append(key)
        else:
            rb.refused[key] = (r.stderr.strip().splitlines() or ["(no message)"])[0]
    return rb


def models_of(keys) -> set[str]:
    return {k.rsplit("/", 1)[0] if "/" in k else k for k in keys}


def model_files(expected: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in expected:
        out.setdefault(model_of(key), []).append(key)
    return out


def model_of(key: str) -> str:
    """MODEL of MODEL/PATH: our prepared models' files are at their top level."""
    return key.rsplit("/", 1)[0]


def listed_models(store: Path) -> set[str] | None:
    r = lmz(store, "ls", "--json")
    if r.rc != 0:
        return None
    data = json.loads(r.stdout)
    return {row["model"] for row in data}


@dataclass
class Killed:
    reached: bool       # the writer said HERE (its kill point) or its delay passed
    finished: bool      # it ended on its own before (rc) or was killed
    rc: int | None
    stderr: str
    hang: bool
    seconds: float = 0.0    # from the fork to the kill, or to its end when it ended first


def check_killed(out, killed: Killed, who: str, point: str, *, timed: bool = True) -> bool:
    """Record on the outcome `out` what a kill left: how long the writer ran when it ended by itself
    (`timed`: the next delays then fall inside its run), a hang, a failure the kill did not cause, a
    traceback. False if it hung (the case ends there)."""
    if timed and killed.finished and killed.rc == 0:
        out.info["writer_seconds"] = killed.seconds
    if killed.hang:
        out.hang = True
        out.problems.append(f"the {who} neither reached {point} nor ended")
        return False
    if killed.finished and killed.rc != 0:
        out.problems.append(f"the {who}, not killed, ended rc={killed.rc}: {killed.stderr.strip()[-300:]}")
    if "Traceback (most recent call last)" in killed.stderr:
        out.traceback = killed.stderr[-3000:]
    return True


def exit_with_lmz(store: Path, argv: list[str]) -> NoReturn:
    """In a forked child: run `lmz --store STORE ARGV` in this process and _exit with its status
    (70 and the traceback on stderr for an exception it let out)."""
    from lmzfs.cli import main
    try:
        rc = main(["--store", str(store), *argv])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:       # noqa: B036
        tb_mod.print_exc()
        rc = 70
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc if isinstance(rc, int) else 1)


def fork_writer_and_kill(store: Path, argv: list[str], *, point: str | None, delay: float,
                         stderr_path: Path, bound: float = 90.0, go_on: bool = False) -> Killed:
    """Fork a child that runs `lmz ARGV` in-process with the kill point `point` switched on
    (lmzfs/killpoints.py), and SIGKILL it once it prints HERE (`delay` seconds after), or after
    `delay` seconds when `point` is None. go_on: the writer does not wait at the point but goes
    on, so that the kill lands `delay` seconds into what follows it. The caller must have no
    threads running (fork)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:        # the writer
        try:
            os.close(r)
            os.dup2(w, 1)
            fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
            from lmzfs import killpoints
            killpoints._AT = killpoints._parse(point)
            killpoints._seen.clear()
            if go_on:
                killpoints._WAIT_SECONDS = 0
            exit_with_lmz(store, argv)
        finally:
            os._exit(71)
    os.close(w)
    start = time.monotonic()
    buf = b""
    reached = point is None
    deadline = start + (delay if point is None else bound)
    eof = False
    while not eof:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([r], [], [], left)
        if not ready:
            break
        chunk = os.read(r, 65536)
        if not chunk:
            eof = True
            break
        buf += chunk
        if point is not None and b"HERE\n" in buf:
            reached = True
            break
    if reached and point is not None and delay:
        time.sleep(delay)
    hang = point is not None and not reached and not eof
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(r)
    seconds = time.monotonic() - start
    finished = os.WIFEXITED(status)
    rc = os.WEXITSTATUS(status) if finished else None
    err = stderr_path.read_text(errors="replace") if stderr_path.exists() else ""
    return Killed(reached and not finished, finished, rc, err, hang, seconds)


def unmount_quietly(mnt: Path) -> None:
    import subprocess
    from lmzfs.daemon.mount import is_mount_point
    if is_mount_point(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=30)


def keep_mount_traceback(out: Outcome, fs) -> None:
    """The daemon's traceback, if its log (fs: lmzfs.testing.mount's MountedFS) holds one and the
    case has none yet."""
    log = fs.log()
    if "Traceback (most recent call last)" in log and out.traceback is None:
        out.traceback = log[-3000:]


def mount_failed(out: Outcome, exc: AssertionError) -> Outcome:
    """A case's mount that failed (lmzfs.testing.mount raises AssertionError with the daemon's log):
    one problem line, and the daemon's traceback where its log holds one. Returns ``out``."""
    out.problems.append(f"mount: {str(exc)[-400:]}")
    if "Traceback (most recent call last)" in str(exc):
        out.traceback = str(exc)[-3000:]
    return out
