"""This checkout beside an earlier revision (`bench/run.py --against REV`)."""
from __future__ import annotations

from summary import cell, table


def against_md(a: dict) -> list[str]:
    out = ["## This checkout beside an earlier revision", ""]
    if a.get("error"):
        return out + [f"n/a: {a['error']}", ""]
    out += [f"`lmz add` and a cold front-to-back read through a fresh mount of the same store, with this "
            f"checkout and with commit {a['earlier_commit']}, alternating which goes first, {a['runs']} run(s) "
            "(`bench/run.py --against REV`, bench/against.py). Ratio: this checkout's speed over the earlier "
            "one's within each run, median (min-max) over runs; 1.00 is no change.", ""]
    rows = []
    for r in a["subjects"]:
        for op, what in (("add", "`lmz add`"), ("read", "cold read through the mount")):
            ratio = r[f"{op}_ratio"]
            rows.append([r["subject"], what, cell(r[f"{op}_this_mb_s"], 0), cell(r[f"{op}_earlier_mb_s"], 0),
                         f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"])
    return out + table(["file", "what", "this checkout, MB/s", "earlier, MB/s", "ratio"], rows, "llrrr")


def section(res: dict) -> list[str]:
    return against_md(res["against"]) if res.get("against") else []
