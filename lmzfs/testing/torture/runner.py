"""Run cases each in a forked child (own process group) bounded by its timeout; a child that
runs past it is killed with its group and counted as a hang, never waited on."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmzfs.testing.torture import Case, Outcome

FAMILIES = ("damage", "crashes", "hostile", "access", "load")


def run_case(case: Case, scratch: Path) -> Outcome:
    scratch.mkdir(parents=True, exist_ok=True)
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            try:
                out = case.run()
            except BaseException:       # noqa: B036 -- the harness's own failure, reported as such
                out = Outcome(case.name, problems=["harness error: " + traceback.format_exc()[-1500:]])
            out.name = out.name or case.name
            data = json.dumps(out.to_json(), default=str).encode()
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:       # noqa: B036
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    buf = b""
    deadline = t0 + case.timeout
    hang = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            hang = True
            break
        ready, _, _ = select.select([r], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            buf += chunk
    os.close(r)
    if hang:
        for sig_target in (-pid, pid):
            try:
                os.kill(sig_target, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _, status, usage = os.wait4(pid, 0)
    if hang:
        _unmount_under(scratch)
    try:
        out = Outcome(**json.loads(buf)) if buf else Outcome(case.name, problems=[f"the case child died ({status})"])
    except Exception as exc:      # noqa: BLE001
        out = Outcome(case.name, problems=[f"unreadable outcome: {exc}"])
    if hang:
        out = Outcome(case.name, hang=True, problems=[f"ran past {case.timeout:.0f} s"])
    out.peak_rss_kib = max(out.peak_rss_kib, usage.ru_maxrss)
    out.seconds = time.monotonic() - t0
    return out


def _unmount_under(scratch: Path) -> None:
    """Lazily unmount anything a killed case left mounted under its scratch directory."""
    prefix = str(scratch.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split()
        if len(parts) > 1 and parts[1].startswith(prefix):
            subprocess.run(["fusermount3", "-uz", parts[1]], capture_output=True, timeout=30)


@dataclass(frozen=True)
class Column:
    """One column of the table: what each case adds to its family's row (or, `peak`, the largest)."""
    key: str
    heading: str
    of: Callable[[Outcome], float]
    zero: float = 0
    peak: bool = False

    def fold(self, so_far: float, value: float) -> float:
        return max(so_far, value) if self.peak else so_far + value


COLUMNS = (Column("cases", "cases", lambda o: 1),
           Column("items", "checks", lambda o: o.items),
           Column("wrong_bytes", "wrong bytes", lambda o: o.wrong_bytes),
           Column("models_lost", "models lost", lambda o: o.models_lost),
           Column("named_lost", "named LOST", lambda o: o.named_lost),
           Column("tracebacks", "tracebacks", lambda o: o.traceback is not None),
           Column("hangs", "hangs", lambda o: o.hang),
           Column("problems", "other failures", lambda o: len(o.problems)),
           Column("peak_rss_mib", "peak RSS MiB", lambda o: o.peak_rss_kib / 1024, zero=0.0, peak=True),
           Column("seconds", "seconds", lambda o: o.seconds, zero=0.0))


@dataclass
class Row:
    """A family's totals over its cases: one value a column, and the failed cases' outcomes."""
    family: str
    tally: dict[str, float] = field(default_factory=lambda: {c.key: c.zero for c in COLUMNS})
    failures: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        for c in COLUMNS:
            self.tally[c.key] = c.fold(self.tally[c.key], c.of(o))
        for k, v in o.info.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.info[k] = max(self.info.get(k, 0), v) if k.startswith("peak") else self.info.get(k, 0) + v
        if o.wrong_bytes or o.models_lost or o.traceback or o.hang or o.problems:
            self.failures.append(o.to_json())

    def to_json(self) -> dict:
        return {"family": self.family, **self.tally, "failures": self.failures, "info": self.info}

    def cells(self) -> list[str]:
        return [self.family] + [f"{v:.0f}" if isinstance(v, float) else str(v) for v in self.tally.values()]


def table(rows: list[Row]) -> str:
    cells = [["family"] + [c.heading for c in COLUMNS]]
    total = Row("total")
    for row in rows:
        cells.append(row.cells())
        total.tally = {c.key: c.fold(total.tally[c.key], row.tally[c.key]) for c in COLUMNS}
    cells.append(total.cells())
    return _aligned(cells)


def writer_table(row: Row) -> str:
    """The crashes row by writer: cases, and kills that came before the writer ended."""
    writers = sorted(k.split(" ", 1)[1] for k in row.info if k.startswith("cases "))
    cells = [["writer", "cases", "killed before it ended"]]
    cells += [[w, str(row.info.get(f"cases {w}", 0)), str(row.info.get(f"killed {w}", 0))] for w in writers]
    return _aligned(cells)


def _aligned(cells: list[list[str]]) -> str:
    """A Markdown table padded to its columns: the first row its heading, the first column left-aligned,
    the others right-aligned."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for j, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
