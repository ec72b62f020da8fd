"""The bench report's number formatting: summaries over runs, ratios per run, Markdown tables."""
from __future__ import annotations

import statistics

MiB = 1 << 20


def fmt(v: float | None, digits: int | None = None) -> str:
    if v is None:
        return "n/a"
    if digits is not None:
        return f"{v:,.{digits}f}"
    return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"


def cell(s: dict | None, digits: int | None = None) -> str:
    """median (min) of a summary dict."""
    if not s:
        return "n/a"
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)})"


def ratio(s: dict | None) -> str:
    """median (min) of a ratio, three significant digits."""
    if not s:
        return "n/a"
    f = lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"   # noqa: E731
    return f"{f(s['median'])} ({f(s['min'])})"


def summ(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def per_run(a: list | None, b: list | None, f) -> dict | None:
    """Summary of f(a[i], b[i]) over the runs where both were measured (ratios within one run)."""
    if not a or not b:
        return None
    return summ([f(x, y) for x, y in zip(a, b) if x is not None and y is not None])


def met(ok: bool) -> str:
    """A goal's verdict in a report's prose."""
    return "met" if ok else "**NOT met**"


def table(head: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(head) + " |", "|" + "|".join(sep) + "|", *("| " + " | ".join(r) + " |" for r in rows), ""]


def mbps(series: list | None, n: int) -> list:
    """Seconds per run -> MB/s of an n-byte read (None stays None)."""
    return [None if s is None else n / 1e6 / s for s in (series or [])]


def run_bytes(row: dict, key: str) -> int:
    """The byte count recorded under key by the first run that recorded one (0: none did)."""
    return next((b for b in row.get(key) or [] if b), 0)


def peak_mib(mems: list | None) -> list[float]:
    """Each run's peak memory (VmHWM) of a daemon and its children in MiB, runs without a reading left out."""
    return [(x["vmhwm"] + x["children_vmhwm"]) / MiB for x in mems or [] if x]
