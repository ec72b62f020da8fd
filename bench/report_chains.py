"""Checkpoint chains (issue 25): store bytes against lmzip's, reads through the mount."""
from __future__ import annotations

import statistics

from chains_table import ratio_of, read_ratio
from summary import table


# A base / fine-tune pair's goal is never to be above lmzip.
CHAIN_BYTES_GOAL = {"quire releases": 0.90, "train bf16": 0.88, "train fp32": 0.88,
                    "minilm fine-tune fp32": 1.00, "minilm fine-tune bf16": 1.00}


def chains_md(ch: dict) -> list[str]:
    out = ["## Checkpoint chains (issue 25)", "",
           "Each member added in order as its own model of one fresh store (`lmz add DIR --name chain/MEMBER`, "
           "reference chosen by the store), then `lmz gc`; lmzip: `lmz compress` of all members in one directory (delta coding "
           "on: its best case). Store bytes: `du` of the whole store directory (packs, catalog and its copies). "
           "Reads: the whole file through a fresh mount (store files in the page cache), chained store against a "
           "store holding that member alone; median over runs of the per-run ratio (1 = as fast as alone).", ""]
    if ch.get("error"):
        return out + [f"n/a: {ch['error']}", ""]
    rows = []
    for row in ch["chains"]:
        ours, theirs, r = row.get("ours", {}), row.get("lmzip", {}), ratio_of(row)
        goal = CHAIN_BYTES_GOAL.get(row["name"])
        verdict = "" if r is None or goal is None else (f" (goal ≤ {goal:.2f}: {'met' if r <= goal else 'NOT met'})")
        reads = row.get("reads", {})

        def rd(which: str) -> str:
            x = reads.get(which, {})
            if "error" in x:
                return f"n/a: {x['error'][:120]}"
            q = read_ratio(x)
            if q is None:
                return "n/a"
            speed = x["bytes"] / statistics.median(x["chain_s"]) / 1e6
            want = 0.8 if which == "newest" else 0.25
            return f"{x['member']}: {speed:.0f} MB/s, {q:.2f}× alone (goal ≥ {want}: {'met' if q >= want else 'NOT met'})"
        rows.append([row["name"], str(len(row["members"])), f"{row['logical_bytes']:,}",
                     f"{ours['bytes']:,}" if "bytes" in ours else f"n/a: {ours.get('error', '')[:120]}",
                     f"{theirs['bytes']:,}" if "bytes" in theirs else f"n/a: {theirs.get('error', '')[:120]}",
                     (f"{r:.3f}×" + verdict) if r is not None else "n/a", rd("newest"), rd("oldest")])
    out += table(["chain", "members", "bytes", "lmzfs store", "lmzip archive", "lmzfs / lmzip",
                  "newest through the mount", "oldest through the mount"], rows, "lrrrrlll")
    for row in ch["chains"]:
        adds = row.get("ours", {}).get("adds") or []
        if adds:
            ours = row["ours"]
            out += [f"{row['name']}: `lmz add` per member: "
                    + "; ".join(f"{a['member']} {a['seconds']:.1f} s" for a in adds)
                    + (f"; store before `lmz gc` {ours['bytes_before_gc']:,} B" if "bytes_before_gc" in ours else "")
                    + ".", ""]
    return out


def section(res: dict) -> list[str]:
    return chains_md(res["chains"]) if res.get("chains") else []
