"""`make torture` (issue 48): case families that damage, kill, feed hostile input to, probe the
access of and load a store built from real corpus files, each case in its own bounded child.

One module per family (damage, crashes, hostile, access, load); each yields cases, a case is a
function returning an `Outcome`. `python -m lmzfs.testing.torture [--seconds N] [--sample]`
runs them (runner.py) and prints one table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable


@dataclass
class Outcome:
    name: str
    items: int = 1                  # checks this case made (damages, kills, headers...)
    wrong_bytes: int = 0            # reads that returned bytes differing from the original
    models_lost: int = 0            # models that no longer read back byte for byte (not explained by damaged pack data)
    named_lost: int = 0             # of those, named by repair's "LOST name" lines
    traceback: str | None = None    # a traceback an lmz command let out
    hang: bool = False              # the case (or a child it waited on) ran past its bound
    problems: list[str] = field(default_factory=list)   # any other broken promise (a rerun failing, verify unclean...)
    peak_rss_kib: int = 0           # the case's child's peak resident memory (ru_maxrss of wait4)
    seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], Outcome]
    timeout: float = 120.0
