"""The "writable mount for everyday work" section (issue 47, bench/everyday_table.py) of
docs/results.md, rendered for bench/report.py."""
from __future__ import annotations

import statistics

from summary import met, table


def _x(mount: float, plain: float) -> float | None:
    return mount / plain if plain > 0 else None


def _x_cell(mount: float, plain: float) -> str:
    x = _x(mount, plain)
    return f"{x:.1f}×" if x is not None else "n/a"


def everyday_md(e: dict) -> list[str]:
    out = ["## Writable mount for everyday work (issue 47)", "",
           "`bench/everyday_table.py` (`bench/run.py --only everyday`): each program run into a fresh "
           "`lmz mount --writable` and into a plain directory on the same disk (ext4), in the same run. The "
           "mount's time is the program's own; the mount's commits go on after it in the background, the "
           "seconds until its spool held no record are given beside (\"then committed\").", ""]
    if e.get("error"):
        return out + [f"n/a: {e['error']}", ""]
    m, p, goals = e["mount"], e["ext4"], e.get("goals", {})
    rounds = e.get("rounds") or []
    rows, marks = [], []
    floor = len(rounds) > 1 and all("floor" in r for r in rounds)
    if floor:
        out += [f"The rows that create many files (rsync, small files) ran {len(rounds)} times into ext4, the "
                f"mount and the **pyfuse3 floor** (`bench/pyfuse_floor.py`: an in-memory file system on pyfuse3 "
                f"and trio, as the mount's daemon is, whose handlers do next to nothing and keep nothing: what "
                f"any such daemon costs per request here), in turn, after `sync`, nothing removed until the "
                f"end. Their cells are the quickest run and, in brackets, the median and slowest; × ext4 "
                f"and × floor are ratios of the quickest runs (how long ext4 takes to make files swings "
                f"several-fold from run to run on this disk: the quickest is the least disturbed). The other "
                f"rows ran once.", ""]
    elif len(rounds) > 1:
        out += [f"The rows that create many files (rsync, small files) ran {len(rounds)} times, ext4 and the mount "
                f"in turn (which went first alternating): their cells are the median (min-max) over runs, and "
                f"× ext4 is the median of the ratios within each run (how long ext4 takes to make a file swings "
                f"from run to run on this disk); the other rows ran once.", ""]

    def timed(label: str, key: str, goal_key: str, by_ratio: bool) -> None:
        then = key[:-2] + '_then_committed_s'
        if floor and key in rounds[0]["mount"]:
            cells = {side: sorted(r[side][key] for r in rounds) for side in ("ext4", "mount", "floor")}
            (e4, *_), (mv, *_), (fl, *_) = cells.values()        # each side's quickest run
            x = _x(mv, e4)
            rows.append([label] + [f"{v[0]:.3f} ({statistics.median(v):.3f}, {v[-1]:.3f})" for v in cells.values()]
                        + [f"{statistics.median([r['mount'][then] for r in rounds]):.2f}",
                           _x_cell(mv, e4), _x_cell(fl, e4), _x_cell(mv, fl)])
        elif len(rounds) > 1 and key in rounds[0]["mount"]:
            ps, ms = [r["ext4"][key] for r in rounds], [r["mount"][key] for r in rounds]
            xs = [x for x in (_x(a, b) for a, b in zip(ms, ps)) if x is not None]
            x = statistics.median(xs) if xs else None
            mv = statistics.median(ms)
            rows.append([label, f"{statistics.median(ps):.3f} ({min(ps):.3f}-{max(ps):.3f})",
                         f"{mv:.3f} ({min(ms):.3f}-{max(ms):.3f})",
                         f"{statistics.median([r['mount'][then] for r in rounds]):.2f}",
                         f"{x:.1f}× ({min(xs):.1f}-{max(xs):.1f})" if x is not None else "n/a"])
        else:
            x, mv = _x(m[key], p[key]), m[key]
            row = [label, f"{p[key]:.3f}", f"{m[key]:.3f}", f"{m[then]:.2f}", _x_cell(m[key], p[key])]
            rows.append(row[:3] + [""] + row[3:] + ["", ""] if floor else row)
        goal = goals.get(goal_key)
        if goal is None:
            return
        if by_ratio and x is not None:
            marks.append(f"{label} ≤ {goal:g}× ext4: {met(x <= goal)} ({x:.1f}×)")
        elif not by_ratio:
            marks.append(f"{label} ≤ {goal:g} s: {met(mv <= goal)} ({mv:.3f} s)")

    timed(f"`rsync -a {e['tree']}` ({e['tree_files']:,} files)", "rsync_s", "rsync_x", True)
    timed("5,000 files of 100 bytes: create, write, close", "small_files_s", "small_files_x", True)
    timed("20 `echo x >>` appends to a 200 MB file", "appends_s", "appends_s", False)
    timed("10 one-byte writes to it, a subprocess started after each", "subprocess_writes_s",
          "subprocess_writes_s", False)
    if floor:
        out += table(["program", "ext4 s", "mount s", "pyfuse3 floor s", "then committed s", "mount × ext4",
                      "floor × ext4", "mount × floor"], rows, "lrrrrrrr")
    else:
        out += table(["program", "ext4 s", "mount s", "then committed s", "mount × ext4"], rows, "lrrrr")
    r, rp = m["read_during_commit"], p["read_during_commit"]
    out += ["4 KiB reads at random offsets of a 200 MB file just written and closed, until its commit was "
            "done (ext4: for 2 s after the close):", ""]
    out += table(["", "reads", "p50 ms", "p99 ms", "max ms"],
                 [[name, f"{x['reads']:,}", f"{x['p50_ms']:.3f}", f"{x['p99_ms']:.3f}", f"{x['max_ms']:.1f}"]
                  for name, x in (("ext4", rp), ("mount", r))], "lrrrr")
    if "read_p99_ms" in goals:
        marks.append(f"read p99 during a commit ≤ {goals['read_p99_ms']:g} ms: "
                     f"{met(r['p99_ms'] <= goals['read_p99_ms'])} ({r['p99_ms']:.1f} ms)")
    ls = e.get("log_space") or {}
    if ls.get("pack_bytes"):
        x = ls["pack_bytes"] / ls["file_bytes"]
        out += [f"Space: a 10 MB log appended to 100 times in a store of its own, each append committed: "
                f"{ls['file_bytes']:,} bytes of file, {ls['live_payload_bytes']:,} of live chunk payload, "
                f"{ls['pack_bytes']:,} bytes of packs on disk ({x:.2f}× the file), catalog "
                f"{ls['catalog_bytes']:,} bytes; no `lmz gc` run.", ""]
        if "log_space_x" in goals:
            marks.append(f"packs ≤ {goals['log_space_x']:g}× the live file bytes after 100 appends: "
                         f"{met(x <= goals['log_space_x'])} ({x:.2f}×)")
    if marks:
        out += ["Issue 47's goals: " + "; ".join(marks) + ".", ""]
    return out


def section(res: dict) -> list[str]:
    return everyday_md(res['everyday']) if res.get('everyday') else []
