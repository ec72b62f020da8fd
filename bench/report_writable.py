"""Writable mount (issue 27): `cp` into the mount against `lmz add`."""
from __future__ import annotations

from writable_table import goals as writable_goals, saved, size_ratio, speed_ratio
from summary import cell, summ, table


def writable_md(w: dict) -> list[str]:
    out = ["## Writable mount (issue 27)", "",
           "Per model, each run: `lmz add DIR` into a fresh store against `cp -r DIR/. MNT/MODEL/` into a fresh "
           "`lmz mount --writable` (after `mkdir MNT/MODEL`), both timed as whole processes (`cp` until the mount "
           "has committed every file). Stored: payload bytes of the chunks the catalog references, once the idle "
           "mount has recoded the text chunks its commits coded without zstd's slow level (\"as committed\": "
           "before that; \"recode s\": how long it took, from the last commit). "
           "Throughput ratio: add seconds / cp seconds per run, median (min) over runs.", ""]
    if w.get("error"):
        return out + [f"n/a: {w['error']}", ""]
    mark = {True: "met", False: "**not met**", None: "not measured"}
    out += ["### Issue 27's goals in this run", ""]
    out += table(["goal", "measured", "met"], [[c.goal, c.measured, mark[c.met]] for c in writable_goals(w)], "lll")
    rows = []
    for r in w.get("models", []):
        if "error" in r:
            rows.append([r["model"], f"n/a: {r['error'][:200]}", "", "", "", "", "", ""])
            continue
        q, sp = size_ratio(r), speed_ratio(r)
        pairs = [a / c for a, c in zip(r["add_s"], r["cp_s"]) if c]
        committed = r.get("cp_committed_bytes") or [None]
        rows.append([r["model"], f"{r['logical_bytes']:,}", f"{r['add_stored_bytes'][0]:,}",
                     f"{r['cp_stored_bytes'][0]:,}", f"{100 * (q - 1):+.3f}%" if q else "n/a",
                     f"{committed[0]:,}" if committed[0] is not None else "n/a",
                     cell(summ(r["recode_s"])) if r.get("recode_s") else "n/a",
                     cell(summ(r["add_s"])), cell(summ(r["cp_s"])),
                     f"{sp:.2f} ({min(pairs):.2f})" if sp else "n/a"])
    out += table(["model", "bytes", "stored by lmz add", "stored by cp", "cp vs add", "as committed", "recode s",
                  "lmz add s", "cp s", "cp throughput / add"], rows, "lrrrrrrrrr")
    writes = [(r["model"], r["write"]) for r in w.get("models", []) if r.get("write")]
    if writes:
        out += ["A 4 KiB write into the middle of the stored file, through the first run's mount (open O_RDWR, "
                "pwrite at half the size, close):", ""]
        out += table(["model", "file bytes", "offset", "chunks added", "new payload bytes", "committed after s"],
                     [[m, f"{x['file_bytes']:,}", f"{x['offset']:,}", str(x["chunks_added"]),
                       f"{x['payload_bytes_added']:,}", f"{x['close_s']:.2f}"] for m, x in writes], "lrrrrr")
    mixed = w.get("mixed")
    if mixed and "error" in mixed:
        out += [f"Mixed tree: n/a: {mixed['error']}", ""]
    elif mixed:
        out += [f"Mixed tree copied into one model of a fresh writable mount: `{mixed['model']}`, "
                f"{mixed['py_files']} `.py` files of `{mixed['stdlib']}` (no site-packages), {mixed['json_files']} "
                f"JSON files; cp took {mixed['cp_s']:.1f} s"
                + (f", and the idle mount's recode of the text chunks {mixed['recode_s']:.1f} s more"
                   if "recode_s" in mixed else "")
                + ". zstd -3: each file compressed on its own, sizes summed. A chunk two parts share counts in both "
                "parts' rows; the total counts it once.", ""]
        rows = []
        for part in sorted(mixed["logical_bytes"]):
            n = mixed["logical_bytes"][part]
            committed = mixed.get("committed_stored_bytes", {}).get(part)
            rows.append([part, str(mixed["file_counts"][part]), f"{n:,}",
                         f"{committed:,}" if committed is not None else "n/a",
                         f"{mixed['stored_bytes'].get(part, 0):,}",
                         f"{saved(mixed['stored_bytes'].get(part, 0), n):.1f}%", f"{mixed['zstd_bytes'][part]:,}",
                         f"{saved(mixed['zstd_bytes'][part], n):.1f}%"])
        total = sum(mixed["logical_bytes"].values())
        zs = sum(mixed["zstd_bytes"].values())
        committed = mixed.get("committed_total_bytes")
        rows.append(["**all**", str(sum(mixed["file_counts"].values())), f"{total:,}",
                     f"{committed:,}" if committed is not None else "n/a",
                     f"{mixed['stored_total_bytes']:,}", f"{saved(mixed['stored_total_bytes'], total):.1f}%",
                     f"{zs:,}", f"{saved(zs, total):.1f}%"])
        out += table(["part", "files", "bytes", "as committed", "stored by the mount", "saved", "zstd -3 per file",
                      "saved"], rows, "lrrrrrrr")
    return out


def section(res: dict) -> list[str]:
    return writable_md(res["writable"]) if res.get("writable") else []
