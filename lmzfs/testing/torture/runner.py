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


@dataclass
class Row:
    family: str
    cases: int = 0
    items: int = 0
    wrong_bytes: int = 0
    models_lost: int = 0
    named_lost: int = 0
    tracebacks: int = 0
    hangs: int = 0
    problems: int = 0
    peak_rss_mib: float = 0.0
    seconds: float = 0.0
    failures: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        self.cases += 1
        self.items += o.items
        self.wrong_bytes += o.wrong_bytes
        self.models_lost += o.models_lost
        self.named_lost += o.named_lost
        self.tracebacks += o.traceback is not None
        self.hangs += o.hang
        self.problems += len(o.problems)
        self.peak_rss_mib = max(self.peak_rss_mib, o.peak_rss_kib / 1024)
        self.seconds += o.seconds
        for k, v in o.info.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.info[k] = max(self.info.get(k, 0), v) if k.startswith("peak") else self.info.get(k, 0) + v
        if o.wrong_bytes or o.models_lost or o.traceback or o.hang or o.problems:
            self.failures.append(o.to_json())


COLUMNS = [("family", "family"), ("cases", "cases"), ("items", "checks"), ("wrong_bytes", "wrong bytes"),
           ("models_lost", "models lost"), ("named_lost", "named LOST"), ("tracebacks", "tracebacks"),
           ("hangs", "hangs"), ("problems", "other failures"), ("peak_rss_mib", "peak RSS MiB"),
           ("seconds", "seconds")]


def table(rows: list[Row]) -> str:
    cells = [[h for _, h in COLUMNS]]
    for row in rows:
        cells.append([f"{getattr(row, k):.0f}" if isinstance(getattr(row, k), float) else str(getattr(row, k))
                      for k, _ in COLUMNS])
    total = Row("total")
    for row in rows:
        for k, _ in COLUMNS[1:]:
            v = getattr(row, k)
            setattr(total, k, max(getattr(total, k), v) if k == "peak_rss_mib" else getattr(total, k) + v)
    cells.append([f"{getattr(total, k):.0f}" if isinstance(getattr(total, k), float) else str(getattr(total, k))
                  for k, _ in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = []
    for j, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def writer_table(row: Row) -> str:
    """The crashes row by writer: cases, and kills that came before the writer ended."""
    writers = sorted(k.split(" ", 1)[1] for k in row.info if k.startswith("cases "))
    cells = [["writer", "cases", "killed before it ended"]]
    cells += [[w, str(row.info.get(f"cases {w}", 0)), str(row.info.get(f"killed {w}", 0))] for w in writers]
    widths = [max(len(r[i]) for r in cells) for i in range(3)]
    lines = []
    for j, r in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
