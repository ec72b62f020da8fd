"""Over a shaped link (issue 50): the remote mount against a plain fetcher, and real loaders."""
from __future__ import annotations

import statistics

from summary import cell, fmt, mbps, met, per_run, ratio, summ, table


LINK_GOALS = {"astra": 1.3, "minilm": 1.1, "isnet": 1.1}      # issue 50: cold read × plain GETs at 1 Gbit/s
LINK_LOAD_GOAL = 1.0                                         # issue 50: loader from the mount × fetch + load


def _ok(x: dict) -> bool:
    return isinstance(x, dict) and "error" not in x and x.get("seconds")


def _rate_label(rate: str) -> str:
    return "unshaped" if rate == "none" else rate.replace("gbit", " Gbit/s").replace("mbit", " Mbit/s")


def link_md(lk: dict) -> list[str]:
    out = ["## Over a shaped link (issue 50)", ""]
    if lk.get("error") and not lk.get("rates"):
        return out + [f"n/a: {lk['error']}", ""]
    runs = lk.get("runs", 1)
    first = next(iter(lk.get("rates") or {"": {}}.values()))
    out += ["`bench/link_table.py`: a private network namespace (`ip netns add`), the S3 engine "
            "(SeaweedFS `weed mini`), every `lmz mount --remote` and the plain fetcher inside it "
            "(`ip netns exec`), talking over its own 127.0.0.1. The traffic to and from the engine's S3 port "
            "goes through a token bucket (`tc ... tbf rate R burst B latency 20ms`, burst 512 KiB at 1 Gbit/s, "
            "scaled with the rate; an htb root sends every other port's packets past it, so that the engine's "
            "own hops between its gateway, filer and volume server stay off the link, as they would in a "
            "real object store). The page cache is dropped before each read (`sync; echo 3 > "
            "/proc/sys/vm/drop_caches`, the engine's data too). **plain**: the original file, uploaded to the "
            f"same engine, fetched by ranged GETs of {lk.get('get_bytes', 0) >> 20} MiB, {lk.get('threads')} at "
            f"once, with obstore {lk.get('obstore', '')} (the client the mount uses) into memory: the best a "
            "plain fetcher does on that link. **mount**: a fresh `lmz mount --remote --poll 0` on an empty "
            "`--cache-dir`, the file read front to back in 1 MiB reads. Bytes on the wire: the shaped class's "
            "counter over the read (both directions, headers included). "
            f"{runs} run(s), the two readers' order alternating; cells are median (min) over runs, × plain "
            "within each run.", ""]
    if lk.get("error"):
        out += [f"**The run stopped early**: {lk['error']}", ""]
    files = lk.get("files") or {}
    rows = []
    for rate, e in (lk.get("rates") or {}).items():
        for name, rr in (e.get("reads") or {}).items():
            n = files[name]["bytes"]
            p = [r["plain"]["seconds"] if _ok(r.get("plain")) else None for r in rr]
            m = [r["mount"]["seconds"] if _ok(r.get("mount")) else None for r in rr]
            pw = max([r["plain"].get("wire_bytes") or 0 for r in rr if _ok(r.get("plain"))] or [0])
            mw = max([r["mount"].get("wire_bytes") or 0 for r in rr if _ok(r.get("mount"))] or [0])
            cpu = summ([r["mount"].get("mount_cpu_s") for r in rr if _ok(r.get("mount"))])
            eng = summ([r["mount"].get("engine_cpu_s") for r in rr if _ok(r.get("mount"))])
            pcpu = summ([r["plain"].get("engine_cpu_s") for r in rr if _ok(r.get("plain"))])
            rows.append([_rate_label(rate), name, f"{n:,}", cell(summ(mbps(p, n)), 0), f"{pw:,}",
                         cell(summ(mbps(m, n)), 0), f"{mw:,} ({mw / n:.3f} of the file)" if n else "",
                         ratio(per_run(p, m, lambda a, b: a / b)),
                         f"{fmt(cpu['median'])} ({fmt(eng['median'])}; plain: {fmt(pcpu['median'])})"
                         if cpu and eng and pcpu else "n/a"])
    if rows:
        out += ["Cold sequential read, MB/s of the original file:", ""]
        out += table(["link", "file", "bytes", "plain MB/s", "plain: bytes on the wire", "mount MB/s",
                      "mount: bytes on the wire", "× plain", "CPU s: mount daemon (engine)"], rows, "llrrrrrrr")
        loads = [r[w]["loadavg"] for e in (lk.get("rates") or {}).values() for rr in (e.get("reads") or {}).values()
                 for r in rr for w in ("plain", "mount") if _ok(r.get(w)) and r[w].get("loadavg") is not None]
        if loads:
            out += [f"CPU s: the mount daemon's CPU seconds (every thread, user + system) over the read, median, and "
                    f"in brackets the engine's over the same read and over the plain fetch. The machine's 1-min load "
                    f"average after each read: median {statistics.median(loads):.1f}, max {max(loads):.1f} "
                    "(other work shares its CPUs with the decoder).", ""]
    checks = [r["mount"].get("sha256_ok") for e in (lk.get("rates") or {}).values()
              for rr in (e.get("reads") or {}).values() for r in rr if _ok(r.get("mount"))
              and "sha256_ok" in r["mount"]]
    if checks:
        out += [f"Every file read through the remote mount on the last link was checked against the original's "
                f"SHA-256: {'identical' if all(checks) else '**NOT identical**'}.", ""]
    lrows = []
    load_rate = None
    for rate, e in (lk.get("rates") or {}).items():
        for name, rr in (e.get("loads") or {}).items():
            load_rate = rate
            f = [r["plain"]["fetch_s"] if _ok(r.get("plain")) else None for r in rr]
            ld = [r["plain"]["load_s"] if _ok(r.get("plain")) else None for r in rr]
            p = [r["plain"]["seconds"] if _ok(r.get("plain")) else None for r in rr]
            m = [r["mount"]["seconds"] if _ok(r.get("mount")) else None for r in rr]
            loader = "gguf.GGUFReader + every tensor copied" if files[name]["name"].endswith(".gguf") else \
                "safetensors `safe_open` (torch) + every tensor cloned"
            lrows.append([name, loader, cell(summ(f)), cell(summ(ld)), cell(summ(p)), cell(summ(m)),
                          ratio(per_run(p, m, lambda a, b: a / b))])
    if lrows:
        out += [f"A real loader at {_rate_label(load_rate)}: over the plain file fetched first (the same ranged GETs, "
                "written to a local file, then loaded from it: fetch + load), and over a fresh remote mount, cold "
                "(the loader reading the mount's file; its mmap faults are what fetches). Seconds:", ""]
        out += table(["file", "loader", "plain: fetch", "plain: load", "plain: fetch + load", "remote mount",
                      "× plain"], lrows, "llrrrrr")
    goals = []
    one = (lk.get("rates") or {}).get("1gbit") or {}
    for name, goal in LINK_GOALS.items():
        rr = (one.get("reads") or {}).get(name)
        if not rr:
            continue
        s = per_run([r["plain"]["seconds"] if _ok(r.get("plain")) else None for r in rr],
                    [r["mount"]["seconds"] if _ok(r.get("mount")) else None for r in rr], lambda a, b: a / b)
        if s:
            goals.append(f"{name} cold read ≥ {goal}× plain at 1 Gbit/s: {met(s['median'] >= goal)}, "
                         f"{s['median']:.2f}× (min {s['min']:.2f}×)")
    for name, rr in (one.get("loads") or {}).items():
        s = per_run([r["plain"]["seconds"] if _ok(r.get("plain")) else None for r in rr],
                    [r["mount"]["seconds"] if _ok(r.get("mount")) else None for r in rr], lambda a, b: a / b)
        if s:
            goals.append(f"{name} loader from the mount ≥ {LINK_LOAD_GOAL:g}× fetch + load at 1 Gbit/s: "
                         f"{met(s['median'] >= LINK_LOAD_GOAL)}, {s['median']:.2f}× (min {s['min']:.2f}×)")
    if goals:
        out += ["Issue 50's goals (medians): " + "; ".join(goals) + ".", ""]
    return out


def section(res: dict) -> list[str]:
    return link_md(res["link"]) if res.get("link") else []
