"""Compression (issue 3): saved % per tool and file, and each tool's speeds."""
from __future__ import annotations

from summary import cell, fmt, table


def margin(subject: dict, ours: str) -> float | None:
    rows = {r["tool"]: r for r in subject["tools"]}
    mine = rows.get(ours)
    others = [r["saved_pct"] for r in subject["tools"] if not r["ours"] and r["saved_pct"] is not None]
    if not mine or mine["saved_pct"] is None or not others:
        return None
    return mine["saved_pct"] - max(others)


def best_other(subject: dict) -> str:
    others = [r for r in subject["tools"] if not r["ours"] and r["saved_pct"] is not None]
    return max(others, key=lambda r: r["saved_pct"])["tool"] if others else "n/a"


def notes_of(r: dict) -> str:
    if r["error"]:
        return f"n/a: {r['error'][:240]}"
    parts = []
    n = r["notes"]
    if "store_du_bytes" in n:
        parts.append(f"store dir du {n['store_du_bytes']:,} B")
    dtypes = sorted({v for k, v in n.items() if k.startswith("dtype:")})
    if dtypes:
        parts.append("dtype " + "/".join(dtypes))
    if n.get("charged_per_file"):
        parts.append("per file (each chunk charged to the first file using it): "
                     + ", ".join(f"{k} {v:,} B" for k, v in n["charged_per_file"].items()))
    if n.get("one_archive"):
        parts.append("both files in one archive")
    if n.get("per_file"):
        parts.append("each file on its own, sizes summed")
    if len(set(r["stored_bytes_per_run"])) > 1:
        parts.append(f"sizes vary: {r['stored_bytes_per_run']}")
    for key in ("logical_bytes_mismatch", "original_size_mismatch"):
        if key in n:
            parts.append(f"{key} {n[key]}")
    if r["startup_s"] is not None:
        parts.append(f"start-up {r['startup_s']:.2f} s/run")
    if r["decode_error"]:
        parts.append(f"decode n/a: {r['decode_error'][:240]}")
    elif r["kind"] == "store" and r["decode_s"]:
        parts.append("decode = read through a fresh mount")
    if r["lossless_checked"]:
        parts.append("round trip SHA-256 ok")
    return "; ".join(parts)


def compression_md(subjects: list[dict], runs: int) -> list[str]:
    tools = [r["tool"] for r in subjects[0]["tools"]] if subjects else []
    ours = [r["tool"] for r in subjects[0]["tools"] if r["ours"]] if subjects else []
    out = ["## Compression (issue 3)", "",
           f"Saved % = 100 × (1 − stored / original). **margin** = our saved % minus the best other tool's "
           f"(percentage points; positive: we store less). Speeds below, median (min) of {runs} runs.", ""]
    head = ["file", "bytes", *tools, *(f"margin: {o}" for o in ours), "best other"]
    rows = []
    for s in subjects:
        by = {r["tool"]: r for r in s["tools"]}
        row = [s["subject"], f"{s['bytes']:,}"]
        row += [fmt(by[t]["saved_pct"], 2) if by[t]["saved_pct"] is not None else "n/a" for t in tools]
        for o in ours:
            m = margin(s, o)
            row.append("n/a" if m is None else f"**{m:+.2f}**")
        row.append(best_other(s))
        rows.append(row)
    out += table(head, rows)
    for s in subjects:
        files = ", ".join(f"`{f['name']}` ({f['bytes']:,} B)" for f in s["files"])
        out += [f"### {s['subject']}: {files}", ""]
        if s.get("note"):
            out += [s["note"], ""]
        rows = []
        for r in s["tools"]:
            if r["error"]:
                rows.append([r["tool"], "n/a", "n/a", "n/a", "n/a", notes_of(r)])
            else:
                rows.append([r["tool"], f"{r['stored_bytes']:,}", fmt(r["saved_pct"], 2),
                             cell(r["encode_mbps"]), cell(r["decode_mbps"]), notes_of(r)])
        out += table(["tool", "stored bytes", "saved %", "encode MB/s", "decode MB/s", "notes"], rows, "lrrrrl")
    return out


def section(res: dict) -> list[str]:
    comp = res.get("compress")
    if isinstance(comp, dict) and comp.get("error"):
        return ["## Compression (issue 3)", "", f"n/a: {comp['error']}", ""]
    return compression_md(comp, res["meta"]["runs"]) if comp else []
