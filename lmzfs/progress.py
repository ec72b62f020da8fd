"""Progress on stderr: one line redrawn in place on a terminal; elsewhere (a systemd unit, a CI
log) a plain line every LOG_INTERVAL seconds, so a long command is seen to be working."""
from __future__ import annotations

import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


LOG_INTERVAL = 5.0        # seconds between lines where stderr is not a terminal


class ProgressLine:
    def __init__(self, label: str, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.started = time.monotonic()
        self._last = self.started if not self.enabled else 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.enabled and now - self._last < 0.2 and done < total:
            return
        if not self.enabled and (now - self._last < LOG_INTERVAL or done >= total):
            return         # the finished command's own report says the rest
        self._last = now
        rate = done / max(now - self.started, 1e-6)
        pct = 100.0 * done / total if total else 100.0
        eta = f"  ETA {_clock((total - done) / rate)}" if rate > 0 and total > done else ""
        text = (f"{self.label}: {pct:5.1f}%  {human_bytes(done)} / {human_bytes(total)}  "
                f"{human_bytes(rate)}/s{eta}")
        self.stream.write(f"\r{text}   " if self.enabled else f"{text}\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
