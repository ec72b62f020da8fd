"""Mount (issue 4): sequential and random reads, concurrency and memory, loaders."""
from __future__ import annotations

import statistics

from goals import goals_md
from summary import MiB, cell, fmt, mbps, peak_mib, per_run, ratio, run_bytes, summ, table


def mount_md(m: dict) -> list[str]:
    runs, nbytes = m["runs"], m["file"]["bytes"]
    targets = m.get("targets", [])
    plain = next((t["label"] for t in targets if t["kind"] == "plain"), None)
    mounts = [t for t in targets if t["kind"] != "plain"]
    out = ["## Mount (issue 4)", "",
           f"On `{m['file']['name']}` ({nbytes:,} B, BF16) unless said otherwise. Every cold read is on a "
           f"fresh mount with the store's files already in the page cache. Values are median (min) of "
           f"{runs} runs; **× plain** compares with the plain file read from the page cache in the same "
           f"run (ratio per run, then median (min) over runs)."
           + (" The readers take turns within each run, and each run starts with a different one."
              if m.get("order") == "rotating" else "")
           + (" Before the first run every reader reads the file once through a fresh mount, not counted: "
              "right after the stores are built the host stays slower for a while."
              if m.get("warm_up_mbps") else ""), ""]
    cap = m.get("default_cache_bytes")
    if cap:
        out += [f"With no options our mount uses a {cap / MiB:.0f} MiB chunk cache (its stats.json); "
                f"the rows below pass `--cache-size {m.get('default_cache', '')}` explicitly.", ""]

    out += goals_md(m)

    # sequential
    seq = m["seq"]
    p = seq.get(plain, {})
    p_cold = mbps(p.get("cold_s"), nbytes)
    rows = []
    for t in targets:
        r = seq.get(t["label"], {})
        if r.get("error") and not r.get("cold_s"):
            rows.append([t["label"], "n/a", "", "n/a", "", "", "", r["error"][:200]])
            continue
        cold, warm = mbps(r.get("cold_s"), nbytes), mbps(r.get("warm_s"), nbytes)
        warm2 = mbps(r.get("warm2_s"), nbytes)     # absent from runs before the third read was added
        rows.append([t["label"], cell(summ(cold)),
                     "1" if t["kind"] == "plain" else ratio(per_run(cold, p_cold, lambda a, b: a / b)),
                     cell(summ(warm)),
                     "1" if t["kind"] == "plain" else ratio(per_run(warm, p_cold, lambda a, b: a / b)),
                     "1" if t["kind"] == "plain" and warm2 else ratio(per_run(warm2, p_cold, lambda a, b: a / b)),
                     cell(summ(r.get("ready_s") or [])) if t["kind"] != "plain" else "—",
                     r.get("error") or ""])
    out += ["### Sequential read, 1 MiB reads", "",
            "cold: first read on a fresh mount; warm: the second read through the same mount; warm again: "
            "the third. × plain: MB/s over the plain file's page-cache read (first read) in the same run. "
            "Every warm read is served from the kernel's page cache without asking the daemon; the first "
            "one also pays the kernel's one-time activation of each cached 4 KiB page (moving it to the "
            "active list on its second access), which the plain file, read many times before and cached "
            "in large folios, no longer pays.", ""]
    out += table(["reader", "cold MB/s", "cold × plain", "warm MB/s", "warm × plain", "warm again × plain",
                  "mount ready s", "notes"], rows, "lrrrrrrl")
    out += ceiling_md(m)
    out += decode_bound_md(m)

    # random reads
    rnd = m["rand"]
    p = rnd.get(plain, {})
    rows = []
    for t in targets:
        r = rnd.get(t["label"], {})
        if not r.get("p50_us"):
            rows.append([t["label"], "n/a", "n/a", "n/a", "", (r.get("error") or "")[:200]])
            continue
        rows.append([t["label"], cell(summ(r["p50_us"])), cell(summ(r["p99_us"])), cell(summ(r["mean_us"])),
                     "1" if t["kind"] == "plain" else ratio(per_run(r["p50_us"], p.get("p50_us"), lambda a, b: a / b)),
                     r.get("error") or ""])
    out += [f"### Random 4 KiB reads ({m['reads']:,} preads at random 4 KiB-aligned offsets, fresh mount)", "",
            "Latency of each `os.pread` (perf_counter_ns). Here the min is the best run.", ""]
    out += table(["reader", "p50 µs", "p99 µs", "mean µs", "p50 × plain", "notes"], rows, "lrrrrl")

    # concurrency and memory
    conc = m["conc"]
    one_bytes = nbytes
    rows = []
    for t in targets:
        r = conc.get(t["label"], {})
        if not r.get("eight_s"):
            rows.append([t["label"]] + ["n/a"] * 7 + [t.get("cache_size") or "—", (r.get("error") or "")[:200]])
            continue
        one = mbps(r.get("one_s"), r.get("one_bytes", [one_bytes])[0] or one_bytes)
        eight = mbps(r.get("eight_s"), run_bytes(r, "eight_bytes"))
        # runs before 2 Dec 2026 read one file only
        one_all = mbps(r["one_all_s"], run_bytes(r, "one_all_bytes")) if r.get("one_all_s") else []
        mems = [x for x in r.get("mem") or [] if x]
        hwm = summ(peak_mib(mems))
        rss = summ([(x["vmrss"] + x["children_vmrss"]) / MiB for x in mems])
        kids = max((x["children"] for x in mems), default=0)
        rows.append([t["label"], cell(summ(one)), cell(summ(one_all)) if one_all else "n/a", cell(summ(eight)),
                     ratio(per_run(eight, one_all, lambda a, b: a / b)) if one_all else "n/a",
                     ratio(per_run(eight, one, lambda a, b: a / b)),
                     "—" if not hwm else f"{fmt(hwm['median'], 0)} (max {fmt(hwm['max'], 0)})",
                     "—" if not rss else fmt(rss["median"], 0),
                     t.get("cache_size") or "—",
                     "; ".join(x for x in [f"incl. {kids} child process(es)" if kids else "", r.get("error") or ""] if x)])
    vb = m.get("variant_bytes", 0)
    out += [f"### Concurrency and daemon memory: {m['variants']} readers of {m['variants']} different files "
            f"({vb / 1e9:.2f} GB in all)", "",
            f"The files are astra with the low mantissa bits XORed with 1..{m['variants']} (same size and "
            "compressibility, no chunk shared). 1 reader, 1 file: one of them on a fresh mount; 1 reader, "
            f"{m['variants']} files: all of them one after another on another fresh mount (the same bytes "
            f"as the {m['variants']} readers, and about as long); {m['variants']} readers: one thread per file "
            "on a third fresh mount, total MB/s. **8 vs 1** divides the 8 readers' MB/s by the one reader's "
            "of the same 8 files; **8 vs 1 file** by the one reader's of one file, a read a tenth as long. "
            "Memory: VmHWM (peak) and VmRSS of the daemon (/proc/PID/status, our pid from "
            "`MNT/.lmzfs/stats.json`) right after the 8 readers finish.", ""]
    out += table(["reader", "1 reader, 1 file MB/s", f"1 reader, {m['variants']} files MB/s", "8 readers MB/s",
                  "8 vs 1", "8 vs 1 file", "daemon VmHWM MiB", "VmRSS MiB", "configured cache", "notes"],
                 rows, "lrrrrrrrll")
    if m.get("rss"):
        rows = []
        for r in m["rss"]:
            hwm = summ(peak_mib(r["mem"]))
            eight = mbps(r["eight_s"], vb)
            rows.append([r["label"], r["cache_size"], "n/a" if not hwm else f"{fmt(hwm['median'], 0)} (max {fmt(hwm['max'], 0)})",
                         cell(summ(eight)), (r.get("error") or "")[:200]])
        for t in mounts:
            if t["kind"] == "ours":
                r = conc.get(t["label"], {})
                hwm = summ(peak_mib(r.get("mem")))
                rows.append([t["label"], t["cache_size"], "n/a" if not hwm else f"{fmt(hwm['median'], 0)} (max {fmt(hwm['max'], 0)})",
                             cell(summ(mbps(r.get("eight_s"), run_bytes(r, "eight_bytes")))), ""])
        out += ["Our daemon's peak memory against its configured `--cache-size`, same 8-reader stream:", ""]
        out += table(["mount", "--cache-size", "VmHWM MiB", "8 readers MB/s", "notes"], rows, "llrrl")

    # loaders
    ld = m["load"]
    p = ld.get(plain, {})
    rows = []
    for t in targets:
        r = ld.get(t["label"], {})
        if not r.get("safetensors_s") and not r.get("gguf_s"):
            rows.append([t["label"], "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", (r.get("error") or "")[:200]])
            continue
        plain_row = t["kind"] == "plain"
        row = [t["label"]]
        for key in ("safetensors_s", "safetensors_copy_s", "gguf_s"):
            if not r.get(key):      # a run from before this column existed
                row += ["n/a", "n/a"]
                continue
            row += [cell(summ(r[key]), 2),
                    "1" if plain_row else ratio(per_run(r.get(key), p.get(key), lambda a, b: a / b))]
        rows.append(row + [r.get("error") or ""])
    out += ["### Loading through the mount", "",
            f"`safetensors.safe_open(framework=\"pt\")` + `get_tensor` of every tensor of `{m['file']['name']}`: "
            "the tensors are views of safetensors' own mmap of the file, so only the pages the loader touches "
            "are read (**lazy**); the same with a copy of every tensor (**copied**: every byte read, as a model "
            f"load does); `gguf.GGUFReader` + a copy of every tensor's data of `{m['gguf']['name']}`. Each on a "
            "fresh mount. Seconds (min = best run); × plain = time over the plain file's time in the same run "
            "(1 = no cost).", ""]
    out += table(["reader", "safe_open lazy s", "× plain", "safe_open copied s", "× plain", "GGUFReader s", "× plain",
                  "notes"], rows, "lrrrrrrl")
    if m.get("errors"):
        out += ["Errors: " + "; ".join(m["errors"]), ""]
    return out


def ceiling_md(m: dict) -> list[str]:
    """What serving alone costs: our mount reading bytes no codec can shrink (stored raw)."""
    rows = list(m.get("ceiling", {}).values())
    if not rows:
        return []
    row, info = rows[0], m.get("ceiling_file", {})
    ours = [v for v in mbps(row.get("cold_s"), info.get("bytes", 0)) if v is not None]
    if not ours:
        return ["", f"**Serving ceiling**: not measured ({(row.get('error') or 'no run')[:200]}).", ""]
    lmzip = [v for v in mbps(m["seq"].get("lmzip mount", {}).get("cold_s"), m["file"]["bytes"]) if v is not None]
    three = summ([3 * v for v in lmzip]) if lmzip else None
    return ["", f"**Serving ceiling**: the same mount options on a store of {info['bytes']:,} random bytes "
            "(incompressible, so every chunk is stored raw and a read costs only its checksum and the "
            f"FUSE path) read cold at {cell(summ(ours))} MB/s, {len(ours)} runs: the most any codec could "
            "reach through this daemon on this host"
            + (f"; 3× lmzip's cold read in this run is {cell(three)} MB/s" if three else "") + ".", ""]


def decode_bound_md(m: dict) -> list[str]:
    """Decoding alone, in the same run: what our default mount's cold read could at best reach."""
    db = m.get("decode_bound") or {}
    if not db:
        return []
    parts = []
    for when in ("start", "end"):
        r = db.get(when)
        if r and r.get("mbps"):
            cores = summ([c * v / (r["bytes"] / 1e6) for c, v in zip(r["cpu_s"], r["mbps"])]) if r.get("cpu_s") else None
            parts.append(f"{cell(summ(r['mbps']))} MB/s at the {when}"
                         + (f" ({fmt(cores['median'], 2)} cores busy)" if cores else ""))
    if not parts:
        return []
    # the first of our rows is the default store, the one decoded here
    label = next((t["label"] for t in m.get("targets", []) if t["kind"] == "ours"), None)
    ours = [v for v in mbps(m["seq"].get(label, {}).get("cold_s"), m["file"]["bytes"]) if v is not None]
    bound = [v for when in ("start", "end") for v in (db.get(when) or {}).get("mbps", [])]
    share = f"; our default mount's cold read (median) is {fmt(statistics.median(ours) / statistics.median(bound), 2)} of the bound's median" \
        if ours and bound else ""
    threads = next((r.get("threads") for r in db.values() if r), "?")
    return [f"**Decode bound**: astra's chunks in our default store read and decoded in-process by {threads} "
            "threads with the read check a mount makes, no FUSE (`bench/decode_bound.py`): "
            + " and ".join(parts) + f" of the measurements{share}. The host's speed drifts during a day "
            "(on the benchmark host, by up to 2x): read the mount's MB/s against this figure.", ""]


def section(res: dict) -> list[str]:
    mnt = res.get("mount")
    if isinstance(mnt, dict) and mnt.get("error") and "seq" not in mnt:
        return ["## Mount (issue 4)", "", f"n/a: {mnt['error']}", ""]
    return mount_md(mnt) if mnt else []
