"""GGUF through the mount (issue 26): cold reads and GGUFReader loads against lmzip's mount."""
from __future__ import annotations

import statistics

from summary import table


GGUF_READ_GOAL = 1.5      # issue 26: cold sequential read of a K-quant GGUF vs lmzip's mount
GGUF_LOAD_GOAL = 1.3      # issue 26: GGUFReader of smollm2 through the mount vs through lmzip's


def gguf_mount_md(g: dict) -> list[str]:
    out = ["## GGUF through the mount (issue 26)", "",
           "`bench/gguf_mount.py`: each file in a fresh store of ours (default codecs), one of `lmz add --fast` and "
           "one of lmzip's; every timed run on a fresh mount with the store's files in the page cache, the order of "
           "the targets rotating. Cold read: the file front to back in 1 MiB reads (SHA-256 checked in run 1). "
           "Load: `gguf.GGUFReader` and a copy of every tensor's data, on another fresh mount. × lmzip: lmzip's "
           "seconds over ours within a run, median over runs (above 1: faster than lmzip's mount); × plain: our "
           "load's seconds over the plain file's (1 = no cost).", ""]
    if g.get("error"):
        return out + [f"n/a: {g['error']}", ""]
    rows = []
    for name, f in g.get("files", {}).items():
        if "error" in f:
            rows.append([name, "n/a: " + f["error"][:160], "", "", "", "", ""])
            continue
        for target, mbps_runs in f["seq_cold_mbps"].items():
            if target == "plain file (page cache)":
                continue
            ours = target != "lmzip mount"
            rows.append([name if target == "lmzfs mount" else "", target,
                         f"{statistics.median(mbps_runs):,.0f} ({min(mbps_runs):,.0f})",
                         f"{f['seq_speedup_vs_lmzip'][target]:.2f}×" if ours else "1",
                         f"{statistics.median(f['gguf_load_s'][target]):.2f}",
                         f"{f['load_speedup_vs_lmzip'][target]:.2f}×" if ours else "1",
                         f"{f['load_time_vs_plain'][target]:.2f}"])
    out += table(["file", "reader", "cold read MB/s", "cold × lmzip", "GGUFReader s", "load × lmzip",
                  "load s × plain"], rows, "llrrrrr")
    files = g.get("files", {})
    marks = []
    kq = files.get("smollm2-q4km", {})
    if "seq_speedup_vs_lmzip" in kq:
        r = kq["seq_speedup_vs_lmzip"]["lmzfs mount"]
        marks.append(f"K-quant GGUF cold read {r:.2f}× lmzip's mount (goal ≥ {GGUF_READ_GOAL}: "
                     f"{'met' if r >= GGUF_READ_GOAL else 'NOT met'})")
    sm = files.get("smollm2", {})
    if "load_speedup_vs_lmzip" in sm:
        r = sm["load_speedup_vs_lmzip"]["lmzfs mount"]
        marks.append(f"GGUFReader of smollm2 {r:.2f}× lmzip's mount (goal ≥ {GGUF_LOAD_GOAL}: "
                     f"{'met' if r >= GGUF_LOAD_GOAL else 'NOT met'})")
    if marks:
        out += ["Issue 26's goals here: " + "; ".join(marks) + ".", ""]
    return out


def section(res: dict) -> list[str]:
    return gguf_mount_md(res["gguf_mount"]) if res.get("gguf_mount") else []
