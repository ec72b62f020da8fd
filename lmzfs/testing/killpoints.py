"""kill -9 of a child process at a point it names: for tests that a writer killed anywhere leaves
the store as it was before or after. The writers' own points are named in lmzfs/killpoints.py and
switched on by the environment; a child script may also print its own marker."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def kill_at_point(argv: list[str], point: str, *, delay: float = 0.0) -> None:
    """Start argv with the named kill point `point` switched on (lmzfs/killpoints.py: NAME or
    NAME:N), and kill -9 it once it is there (or `delay` seconds after)."""
    kill_at_marker(argv, "HERE", delay=delay, env={**os.environ, "LMZ_KILL_AT": point})


def kill_at_marker(argv: list[str], marker: str, *, delay: float = 0.0, env: dict | None = None) -> None:
    """Start argv, wait for the line `marker` on its stdout (the child has reached the point to be
    killed at and waits there, or goes on for `delay` seconds more), then SIGKILL it. The child is
    killed and reaped however this ends; AssertionError if its first line is not the marker or it
    did not die by the signal."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        assert line == marker, f"the child printed {line!r} before {marker!r}"
        if delay:
            time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, f"the child ended with status {proc.returncode}"
