"""Named points at which a test kills a writer, switched on by the environment and read here only.

`LMZ_KILL_AT=NAME` (or `NAME:N`, the Nth time) makes a process that reaches point NAME print the
line `HERE` on stdout and wait up to a minute, for the test's `kill -9`
(lmzfs/testing/killpoints.py `kill_at_marker`). Unset, a point costs one comparison. The points:

    append               after a record is appended to a pack (store/packbackend.py)
    session-sealed       after a pack session's records are fsync'd, before its transaction
    session-commit       inside the transaction, after its rows, before COMMIT
    session-committed    right after COMMIT (before gc or compact unlink old packs)
    push-record          after `lmz push` handed a chunk's record to a pack object's upload
    push-data            after it uploaded a pack object, before the object's index
    push-object          after it uploaded a pack object and its index
    push-snapshot        after it uploaded the snapshot, before it switched the pointer
    push-published       after it switched the pointer
"""
from __future__ import annotations

import os
import sys
import time

_WAIT_SECONDS = 60


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    return name, int(nth) if nth.isdigit() else 1


_AT = _parse(os.environ.get("LMZ_KILL_AT"))
_seen: dict[str, int] = {}


def reached(name: str) -> None:
    if _AT is None or _AT[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _AT[1]:
        sys.stdout.write("HERE\n")
        sys.stdout.flush()
        time.sleep(_WAIT_SECONDS)
