"""Markdown of the real-loaders section (issue 49) of the bench's results (bench/loaders_table.py
measures it; bench/report.py renders the whole page and calls this)."""
from __future__ import annotations

from summary import cell, fmt, met, summ, table

PLAIN, OURS, LMZIP, EARLIER = "plain files", "lmzfs mount", "lmzip mount", "lmzfs mount, earlier"
FLOOR = "pyfuse3 floor"
LOADER_GOAL = 1.0           # every real loader through ours at least as fast as through lmzip's mount
ST_PLAIN_GOAL = 2.5         # the ~400 MB FP32 sentence-transformers load within 2.5x the plain files
READ_GOAL = 1.2             # cold sequential and mmap page-order reads >= 1.2x lmzip's mount
READ_KINDS = ("cold", "mmap")


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}×"


def _below_floor(goals: list, goal: float) -> str:
    """Of the rows that miss the goal, those where even the pyfuse3 floor misses it, said."""
    missed = [(n, f) for n, _, v, f in goals if v < goal and f is not None]
    under = [(n, f) for n, f in missed if f < goal]
    if not missed:
        return ""
    if not under:
        return f"; the pyfuse3 floor meets it on each of the {len(missed)} row(s) missed"
    low = min(under, key=lambda x: x[1])
    return (f"; on {len(under)} of the {len(missed)} row(s) missed the pyfuse3 floor itself is below it "
            f"(lowest {low[1]:.2f}×, {low[0]})")


def loaders_md(lo: dict) -> list[str]:
    out = ["## Real loaders through the mount (issue 49)", ""]
    if lo.get("error") and not lo.get("rows"):
        return out + [f"n/a: {lo['error']}", ""]
    targets = lo.get("targets") or [PLAIN, OURS, LMZIP]
    earlier = EARLIER in targets
    floor = FLOOR in targets
    out += ["`bench/loaders_table.py`: each model is added to a store of ours (`lmz add`, default codecs) and to "
            "one of lmzip's" + (f", and to one made by lmzfs at commit {lo.get('earlier_commit')} (**earlier**: "
                                "the read path before this checkout's changes, same run)" if earlier else "")
            + ". Before every timed run the page cache is "
            + ("dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`: the stores' packs are read from disk too)"
               if lo.get("dropped_page_cache") else "**not** dropped (not root)")
            + ", the store gets a fresh mount, and the loader runs in a fresh Python process (its imports not "
            "timed) that reports its seconds and a SHA-256 of its output. sentence-transformers: "
            "`SentenceTransformer(DIR, device=\"cpu\")` + `encode` of two sentences; safe_open: every tensor "
            "`get_tensor` + `clone`; GGUFReader: every tensor's data copied; llama.cpp: `Llama(model_path, "
            "n_ctx=64)` (load only timed; 4 tokens evaluated for the output check); cold: the file read front to "
            "back in 1 MiB reads; mmap: one byte of every 4 KiB page of a mapping touched in file order. "
            f"{lo.get('runs', 1)} run(s), each row measured through every target back to back, their order "
            "rotating from row to row and run to run; cells are median (min) seconds; "
            "× lmzip: lmzip's seconds over ours within a run (above 1: ours is faster), median; × plain: ours "
            "over the plain files' within a run, median."
            + (" **floor**: the model's files copied into `bench/pyfuse_floor.py`, an in-memory file system on "
               "pyfuse3 + trio (as our daemon is) whose read handler only slices its bytes (read_ahead_kb as "
               "ours), page cache dropped: the quickest any pyfuse3 + trio daemon serves that loader on this "
               "host, with nothing to decode and no disk to read; floor × lmzip: lmzip's seconds over the "
               "floor's, median." if floor else ""), ""]
    models = lo.get("models") or {}
    if models:
        out += ["Models: " + "; ".join(f"{n} {m['bytes']:,} bytes" for n, m in models.items()) + ".", ""]
    head = ["loader", "plain s", "ours s", "lmzip s"] + (["floor s"] if floor else []) + \
        (["earlier s"] if earlier else []) + ["× lmzip", "× plain"] + (["floor × lmzip"] if floor else []) + \
        (["earlier × lmzip"] if earlier else []) + ["outputs"]
    rows, goals = [], []
    for r in lo.get("rows") or []:
        s = r.get("seconds") or {}
        cells = [r["name"]] + [cell(summ(s.get(t) or []), 2) for t in (PLAIN, OURS, LMZIP)]
        if floor:
            cells.append(cell(summ(s.get(FLOOR) or []), 2))
        if earlier:
            cells.append(cell(summ(s.get(EARLIER) or []), 2))
        cells += [_x(r.get("speedup_vs_lmzip")), _x(r.get("times_plain"))]
        if floor:
            cells.append(_x(r.get("floor_vs_lmzip")))
        if earlier:
            cells.append(_x(r.get("earlier_speedup_vs_lmzip")))
        errors = r.get("errors") or {}
        cells.append("identical" if r.get("identical") else
                     ("; ".join(f"{t}: {e[:120]}" for t, e in errors.items()) or "**differ**"))
        rows.append(cells)
        ratio = r.get("speedup_vs_lmzip")
        if ratio is not None:
            goal = READ_GOAL if r["kind"] in READ_KINDS else LOADER_GOAL
            goals.append((r["name"], goal, ratio, r.get("floor_vs_lmzip")))
    out += table(head, rows, "l" + "r" * (len(head) - 2) + "l")
    st = [r for r in lo.get("rows") or [] if r["kind"] == "st" and r.get("model") == "bert"]
    for r in st:
        load = r.get("load_s") or {}
        ours, theirs, plain = (summ(load.get(t) or []) for t in (OURS, LMZIP, PLAIN))
        if ours and theirs and plain:
            out += [f"Of the bert-base load + encode, the load alone (`SentenceTransformer(...)`, before any "
                    f"encode) took {fmt(ours['median'], 2)} s through ours, {fmt(theirs['median'], 2)} s through "
                    f"lmzip's mount and {fmt(plain['median'], 2)} s from the plain files (medians).", ""]
    if goals:
        loaders = [(n, g, v, f) for n, g, v, f in goals if g == LOADER_GOAL]
        reads = [(n, g, v, f) for n, g, v, f in goals if g == READ_GOAL]
        marks = []
        if loaders:
            worst = min(loaders, key=lambda x: x[2])
            marks.append(f"every loader ≥ {LOADER_GOAL:g}× lmzip's mount: "
                         f"{met(all(v >= LOADER_GOAL for _, _, v, _ in loaders))} (lowest {worst[2]:.2f}×, {worst[0]})"
                         + _below_floor(loaders, LOADER_GOAL))
        for r in st:
            v = r.get("times_plain")
            if v is not None:
                marks.append(f"bert-base sentence-transformers load + encode within {ST_PLAIN_GOAL:g}× the plain "
                             f"files: {met(v <= ST_PLAIN_GOAL)} ({v:.2f}×)")
        if reads:
            worst = min(reads, key=lambda x: x[2])
            marks.append(f"cold and mmap reads ≥ {READ_GOAL:g}× lmzip's mount: "
                         f"{met(all(v >= READ_GOAL for _, _, v, _ in reads))} (lowest {worst[2]:.2f}×, {worst[0]})"
                         + _below_floor(reads, READ_GOAL))
        out += ["Issue 49's goals (medians): " + "; ".join(marks) + ".", ""]
    versions = lo.get("versions") or {}
    if versions:
        out += ["Loaders: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ".", ""]
    for note in lo.get("notes") or []:
        out += [f"Note: {note}", ""]
    for err in lo.get("errors") or []:
        out += [f"Failed: {err}", ""]
    return out


def section(res: dict) -> list[str]:
    return loaders_md(res['loaders']) if res.get('loaders') else []
