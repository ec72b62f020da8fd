"""Remote store (issue 45): push, reads through `lmz mount --remote`, clients, polling, the cache cap."""
from __future__ import annotations

from summary import cell, fmt, mbps, met, per_run, ratio, summ, table


REMOTE_GOALS = {"cold": 0.8, "warm": 0.95, "fetched": 1.03, "cache_cap": 1.05}     # issue 45


def remote_md(r: dict) -> list[str]:
    out = ["## Remote store (issue 45)", "",
           f"`bench/remote_table.py`: an S3 engine on this machine ({r.get('engine', 'SeaweedFS')}), so what is "
           "measured is lmzfs's side of the wire: the client, the block cache and the mount, not a network. "
           f"{r.get('runs', 1)} run(s); cells are median (min) over runs.", ""]
    if r.get("error"):
        return out + [f"n/a: {r['error']}", ""]
    n = r["file"]["bytes"]
    stored = r.get("stored_bytes")
    errors = r.get("errors") or {}
    pushes = r.get("push") or []
    if pushes:
        secs = [p["seconds"] for p in pushes]
        up = pushes[0]["bytes_uploaded"]
        rows = [["`lmz push` of a store holding astra to an empty prefix", cell(summ(mbps(secs, n)), 0),
                 f"{up:,} ({pushes[0]['objects']} pack object)", cell(summ(secs))]]
        again = r.get("push_again")
        if again:
            rows.append(["the same push again (nothing new)", "", f"{again['bytes_uploaded']:,}",
                         f"{again['seconds']:.2f}"])
        ft = r.get("push_finetune")
        if ft:
            reqs = ", ".join(f"{k} {v}" for k, v in sorted(ft["requests"].items()))
            rows.append([f"push after `lmz add` of a fine-tune of astra ({r['finetune']['changed_bytes'] >> 20} MiB "
                         f"of its weights changed)", "",
                         f"{ft['bytes_uploaded']:,} in {ft['chunks']} chunk(s); {ft['sent_to_engine']:,} sent to the "
                         f"engine in all ({reqs})", f"{ft['seconds']:.2f}"])
        out += ["Push (astra: {:,} bytes, {:,} stored):".format(n, stored or 0), ""]
        out += table(["push", "MB/s of the file", "bytes uploaded", "seconds"], rows, "lrrr")
    reads = r.get("reads") or []
    if reads:
        dropped = all(x[k]["dropped"] for x in reads for k in ("local", "cold", "warm"))
        out += ["Sequential read of astra (1 MiB reads, front to back), each on a fresh mount, the page cache "
                + ("dropped before each (`echo 3 > /proc/sys/vm/drop_caches`)" if dropped else
                   "NOT dropped (not root)") + ": the local store's mount; `lmz mount --remote` with an empty "
                "`--cache-dir` (cold: every byte from the engine); the same again on the cache the cold read "
                "filled (warm: every byte from the disk cache). × local: within each run"
                + (", against the mean of the local read before the remote ones and the same again after "
                   "them (the local row: both)" if all("local_after" in x for x in reads) else "") + ".", ""]
        local = [_local_seconds(x) for x in reads]
        has_cpu = all("mount_cpu_s" in x[k] for x in reads for k in ("local", "cold", "warm"))

        def cpu(key: str) -> list[str]:
            """The read's CPU seconds, mount (engine), medians; none for runs from before they were kept."""
            if not has_cpu:
                return []
            m = summ([x[key]["mount_cpu_s"] for x in reads])["median"]
            e = summ([x[key]["engine_cpu_s"] for x in reads])["median"]
            return [f"{m:.2f} ({e:.2f})"]
        rows = [["local store, `lmz mount`", cell(summ(mbps(local, n)), 0), "1", *cpu("local")]]
        for key, label in (("cold", "remote, cold (empty cache)"), ("warm", "remote, warm (cache filled)")):
            s = [x[key]["seconds"] for x in reads]
            rows.append([label, cell(summ(mbps(s, n)), 0), ratio(per_run(local, s, lambda a, b: a / b)), *cpu(key)])
        out += table(["mount", "MB/s", "× local", *(["CPU s: mount (engine)"] if has_cpu else [])], rows,
                     "lrrr" if has_cpu else "lrr")
        if has_cpu and r.get("cpus"):
            # the cold read's work (the mount's and the engine's CPU seconds) spread over every CPU
            # at once, against the local read as it ran: the most the cold read could reach here
            bound = summ([t * r["cpus"] / (x["cold"]["mount_cpu_s"] + x["cold"]["engine_cpu_s"])
                          for t, x in zip(local, reads)])["median"]
            out += [f"CPU s: the mount's process (every thread, user + system) over the read, median, and in "
                    f"brackets the engine's (it shares this host's {r['cpus']} CPUs). Were the cold read's CPU "
                    f"seconds, the mount's and the engine's, spread over all {r['cpus']} CPUs for its whole "
                    f"length, it would take {r['cpus']}× less than their sum: against the local read as it ran, "
                    f"the most a cold read could reach on this host is {bound:.2f}× the local mount (median).", ""]
        fetched = [x["cold_fetch"]["bytes_fetched"] for x in reads]
        marks = []
        for key in ("cold", "warm"):
            med = (per_run(local, [x[key]["seconds"] for x in reads], lambda a, b: a / b) or {}).get("median")
            if med is not None:
                marks.append(f"{key} read ≥ {REMOTE_GOALS[key]}× the local mount: {met(med >= REMOTE_GOALS[key])}, "
                             f"{med:.2f}×")
        if stored:
            f = max(fetched) / stored
            marks.append(f"bytes fetched for the cold read ≤ {REMOTE_GOALS['fetched']}× stored: "
                         f"{met(f <= REMOTE_GOALS['fetched'])}, {f:.4f}×")
        fx = reads[0]["cold_fetch"]
        out += [f"Fetched from the engine by the cold read: {max(fetched):,} bytes (largest of the runs) in "
                f"{fx['requests']} ranged GET(s) (run 1; mean {fmt(fx['latency_ms_mean'])} ms each), for a file "
                f"of {n:,} bytes stored in {stored or 0:,}; the warm read fetched "
                f"{max(x['warm_fetch']['bytes_fetched'] for x in reads):,}.", "",
                "Issue 45's goals here: " + "; ".join(marks) + ".", ""]
    two = r.get("two_hosts")
    if two:
        out += ["Two \"hosts\": two `lmz mount --remote` processes, each with its own cache dir, on the prefix "
                "holding astra and its fine-tune (after the incremental push): every file "
                + ("byte-identical to the original on both (SHA-256)." if two["identical"] else
                   "**NOT** served identically: " + "; ".join(
                       f"{rel}: host {h} {'error' if v.startswith('error') else 'differs'}"
                       for h, files in two["sha256"].items() for rel, v in files.items()
                       if two["originals"].get(rel) != v) + "."), ""]
    cl = r.get("clients")
    if cl:
        sz = cl["object_bytes"]
        b = cl["seconds"]["boto3"]
        cpu = cl.get("cpu_seconds") or {}
        out += [f"Client library: the largest pack object ({sz:,} bytes) fetched as {cl['requests']} ranged GETs of "
                f"{cl['get_bytes'] >> 20} MiB, {cl['threads']} at once from worker threads (the mount's fetcher's "
                "request size and parallelism), with each client in turn, the order rotating between runs. × boto3: "
                "boto3's seconds over the client's within a run (above 1: faster). CPU: seconds of the fetching "
                "process (every thread, user + system) per GB fetched; the engine's CPU is not in it.", ""]
        names = {"obstore": f"obstore {cl['versions']['obstore']}, through lmzfs's ObjectStore (what the mount uses)",
                 "obstore_raw": f"obstore {cl['versions']['obstore']}, `obstore.get_range` called directly",
                 "boto3": f"boto3 {cl['versions']['boto3']}, `get_object` with Range"}
        rows = []
        for key, label in names.items():
            if key not in cl["seconds"]:
                continue
            secs = cl["seconds"][key]
            cpu_gb = summ([c / (sz / 1e9) for c in cpu.get(key, [])])
            rows.append([label, cell(summ(mbps(secs, sz)), 0),
                         "1" if key == "boto3" else ratio(per_run(b, secs, lambda x, y: x / y)),
                         f"{cpu_gb['median']:.2f}" if cpu_gb else "n/a"])
        out += table(["client", "MB/s", "× boto3", "CPU s per GB"], rows, "lrrr")
    po = r.get("polling")
    if po:
        out += [f"Polling: an idle `lmz mount --remote --poll {po['poll_s']:g}s` behind a counting proxy for "
                f"{po['window_s']:.0f} s made {po['requests']} request(s) "
                f"({', '.join(f'{k}: {v}' for k, v in sorted(po['by_key'].items()))}): "
                f"{po['requests_per_poll']:.2f} request(s) and {po['bytes_per_poll']:,.0f} bytes (both ways, HTTP "
                f"headers included) per poll. At the default {po['fleet_poll_s']:g} s, each host costs the engine "
                f"{po['per_host_per_hour']:,.0f} requests an hour:", ""]
        out += table(["hosts", "requests / hour", "requests / s", "bytes / hour"],
                     [[f"{int(k):,}", f"{v['requests_per_hour']:,.0f}", f"{v['requests_per_s']:,.1f}",
                       f"{v['bytes_per_hour']:,.0f}"] for k, v in po["fleet"].items()])
    cc = r.get("cache_cap")
    if cc:
        peak = cc["peak_du_bytes"] / cc["cap_bytes"]
        out += [f"Disk cache cap: `--cache-size {cc['cap_bytes']}` (a third of astra's stored bytes) while astra is "
                f"read through an empty cache: the cache's blocks peaked at {cc['peak_du_bytes']:,} bytes on disk "
                f"(`du` of its object files, blocks being written included and holes punched for evicted ones not, sampled every 0.1 s), {peak:.3f}× the cap (goal ≤ {REMOTE_GOALS['cache_cap']}: "
                f"{met(peak <= REMOTE_GOALS['cache_cap'])}); {cc['evicted']} blocks evicted; the read fetched "
                f"{cc['fetched_bytes']:,} bytes"
                + (f", {cc['fetched_bytes'] / stored:.2f}× the stored bytes (read-ahead evicted before it was read)"
                   if stored and cc["fetched_bytes"] > 1.03 * stored else "") + ".", ""]
    if errors:
        out += ["Steps that failed: " + "; ".join(f"{k}: {v}" for k, v in errors.items()), ""]
    return out


def section(res: dict) -> list[str]:
    return remote_md(res["remote"]) if res.get("remote") else []


def _local_seconds(run: dict) -> float:
    """A run's local read: the mean of the one before the remote reads and the one after them
    where both were made (a single local read on a shared host moves the ratios by its own noise)."""
    if "local_after" in run:
        return (run["local"]["seconds"] + run["local_after"]["seconds"]) / 2
    return run["local"]["seconds"]
