"""Issue 4's goals, checked against one run's mount measurements (docs/results.json's "mount").

Each goal is judged from the run's own numbers, the way the issue words it, so that the page says
plainly which goals a run met instead of leaving the reader to work it out from the tables.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from summary import MiB, cell, fmt, mbps, peak_mib, per_run, ratio, run_bytes, summ, table

RSS_ALLOWANCE = 256 * MiB          # "daemon RSS <= 256 MiB plus the configured cache"


@dataclass(frozen=True)
class GoalCheck:
    goal: str               # the issue's goal, in short
    measured: str           # what this run measured for it
    met: bool | None        # None: the run did not measure it


def _label(m: dict, kind: str) -> str | None:
    return next((t["label"] for t in m.get("targets", []) if t["kind"] == kind), None)


def _median(values: list) -> float | None:
    return (summ(values) or {}).get("median")


def cache_bytes(size: str | None) -> int | None:
    """'256M' -> bytes; None for what is not such a size (lmzip's own cache description)."""
    got = re.fullmatch(r"(\d+)([KMG]?)", (size or "").strip())
    if not got:
        return None
    return int(got[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[got[2]]


def _sequential(m: dict, ours: str, lmzip: str) -> GoalCheck:
    n = m["file"]["bytes"]
    goal = "sequential cold read ≥ 3× lmzip's mount"
    theirs = mbps(m["seq"].get(lmzip, {}).get("cold_s"), n)
    mine = mbps(m["seq"].get(ours, {}).get("cold_s"), n)
    r = per_run(mine, theirs, lambda a, b: a / b)
    if not r:
        return GoalCheck(goal, "not measured", None)
    best = max(((t["label"], per_run(mbps(m["seq"].get(t["label"], {}).get("cold_s"), n), theirs,
                                     lambda a, b: a / b)) for t in m["targets"] if t["kind"] == "ours"),
               key=lambda lr: lr[1]["median"] if lr[1] else 0)
    text = f"{cell(summ(mine))} MB/s against lmzip's {cell(summ(theirs))}: {ratio(r)}×"
    if best[1] and best[0] != ours:
        text += f"; best of our stores: {best[0]}, {ratio(best[1])}×"
    lz = _median(theirs)
    ceiling = next(iter(m.get("ceiling", {}).values()), {})
    top = _median(mbps(ceiling.get("cold_s"), m.get("ceiling_file", {}).get("bytes", 0)))
    bound = _median([v for r in (m.get("decode_bound") or {}).values() if r for v in r.get("mbps", [])])
    limits = [f"{what} {fmt(v / lz, 2)}× lmzip" for what, v in
              (("decoding alone (no FUSE)", bound), ("serving bytes that need no decoding", top)) if v and lz]
    if limits:
        text += "; at most, on this host: " + ", ".join(limits)
    return GoalCheck(goal, text, r["median"] >= 3)


def _warm(m: dict, ours: str, lmzip: str, plain: str | None) -> GoalCheck:
    n = m["file"]["bytes"]
    goal = "warm re-read ≥ 0.8× a plain file read from the page cache"
    anchor = mbps(m["seq"].get(plain, {}).get("cold_s"), n)
    first = per_run(mbps(m["seq"].get(ours, {}).get("warm_s"), n), anchor, lambda a, b: a / b)
    if not first:
        return GoalCheck(goal, "not measured", None)
    later = per_run(mbps(m["seq"].get(ours, {}).get("warm2_s"), n), anchor, lambda a, b: a / b)
    theirs = per_run(mbps(m["seq"].get(lmzip, {}).get("warm_s"), n), anchor, lambda a, b: a / b)
    text = f"first re-read {ratio(first)}×" + (f", the next {ratio(later)}×" if later else "") \
        + (f" (lmzip's first {ratio(theirs)}×)" if theirs else "")
    return GoalCheck(goal, text, first["median"] >= 0.8)


def _random(m: dict, ours: str) -> GoalCheck:
    goal = "4 KiB random reads: p50/p99 reported, p99 ≤ 2 ms"
    r = m["rand"].get(ours, {})
    p99 = summ(r.get("p99_us") or [])
    if not p99:
        return GoalCheck(goal, "not measured", None)
    text = f"p50 {cell(summ(r['p50_us']))} µs, p99 {fmt(p99['median'] / 1e3, 2)} ms median, " \
           f"{fmt(p99['max'] / 1e3, 2)} ms in the slowest run"
    return GoalCheck(goal, text, p99["median"] <= 2000)


def _eight(m: dict, ours: str) -> GoalCheck:
    goal = "8 concurrent readers of different files at least as fast in total as one"
    r = m["conc"].get(ours, {})
    eight = mbps(r.get("eight_s"), run_bytes(r, "eight_bytes"))
    same = per_run(eight, mbps(r.get("one_all_s"), run_bytes(r, "one_all_bytes")), lambda a, b: a / b)
    one = per_run(eight, mbps(r.get("one_s"), run_bytes(r, "one_bytes")), lambda a, b: a / b)
    if not same and not one:
        return GoalCheck(goal, "not measured", None)
    parts = ([f"{ratio(same)}× one reader of the same 8 files in turn"] if same else []) \
        + ([f"{ratio(one)}× one reader of one file"] if one else [])
    return GoalCheck(goal, ", ".join(parts), (same or one)["median"] >= 1)


@dataclass(frozen=True)
class _Peak:
    label: str          # the mount
    cache_size: str     # its --cache-size
    mib: float          # its highest VmHWM over the runs
    allowed_mib: float  # RSS_ALLOWANCE plus that cache


def _memory(m: dict) -> GoalCheck:
    goal = "daemon RSS ≤ 256 MiB + the configured cache while serving a 1 GB model"
    rows = [(t["label"], t.get("cache_size"), m["conc"].get(t["label"], {}).get("mem"))
            for t in m.get("targets", []) if t["kind"] == "ours"]
    rows += [(r["label"], r["cache_size"], r.get("mem")) for r in m.get("rss", [])]
    peaks = [_Peak(label, size, max(mib), (RSS_ALLOWANCE + cache_bytes(size)) / MiB)
             for label, size, mems in rows if (mib := peak_mib(mems)) and cache_bytes(size) is not None]
    if not peaks:
        return GoalCheck(goal, "not measured", None)
    first, worst = peaks[0], max(peaks, key=lambda p: p.mib / p.allowed_mib)
    text = f"{first.label}, --cache-size {first.cache_size}: VmHWM at most {fmt(first.mib, 0)} MiB of " \
           f"{fmt(first.allowed_mib, 0)} allowed"
    if worst is not first:
        text += f"; closest to its limit: {worst.label}, --cache-size {worst.cache_size}, {fmt(worst.mib, 0)} of " \
                f"{fmt(worst.allowed_mib, 0)}"
    gb = m.get("variant_bytes", 0) / 1e9
    if gb < 1:
        return GoalCheck(goal, text + f" ({len(peaks)} mounts, {gb:.2f} GB read by 8 readers each: under the 1 GB "
                         "the goal asks for)", None)
    return GoalCheck(goal, text + f" ({len(peaks)} mounts, {gb:.2f} GB read by 8 readers each)",
                     all(p.mib <= p.allowed_mib for p in peaks))


def _loads(m: dict, ours: str, plain: str | None) -> GoalCheck:
    goal = "safetensors.safe_open and gguf.GGUFReader loads reported as a ratio to the plain file"
    r, p = m["load"].get(ours, {}), m["load"].get(plain, {})
    got = [(what, per_run(r.get(key), p.get(key), lambda a, b: a / b))
           for what, key in (("safe_open lazy", "safetensors_s"), ("safe_open copied", "safetensors_copy_s"),
                             ("GGUFReader", "gguf_s"))]
    text = ", ".join(f"{what} {ratio(v)}×" for what, v in got if v)
    return GoalCheck(goal, text or "not measured", all(v for _, v in got))


def issue4_goals(m: dict) -> list[GoalCheck]:
    ours, lmzip, plain = _label(m, "ours"), _label(m, "lmzip"), _label(m, "plain")
    if ours is None or lmzip is None:
        return []
    return [_sequential(m, ours, lmzip), _warm(m, ours, lmzip, plain), _random(m, ours), _eight(m, ours),
            _memory(m), _loads(m, ours, plain)]


def goals_md(m: dict) -> list[str]:
    checks = issue4_goals(m)
    if not checks:
        return []
    mark = {True: "met", False: "**not met**", None: "not measured"}
    ours = _label(m, "ours")
    return ["### Issue 4's goals in this run", "",
            f"Judged from this run's medians (min = slowest run), for {ours} unless named; the tables below "
            "have every figure, `docs/operations.md` what bounds them.", "",
            *table(["goal", "measured", "met"], [[c.goal, c.measured, mark[c.met]] for c in checks], "lll")]
