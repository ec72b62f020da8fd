#!/usr/bin/env python3
"""GGUF files through our mount vs lmzip's mount vs the plain file: cold sequential read and a
gguf.GGUFReader load of every tensor.

`make bench` runs it as its GGUF mount section (bench/run.py, `--skip-gguf-mount`); on its own, in
the bench venv:

    bench/.venv/bin/python bench/gguf_mount.py [--runs 3] [--json OUT] [--tmpdir DIR] [NAME ...]

NAME: corpus GGUF files (default: smollm2-q4km, the K-quant one, and smollm2). Each goes into a
fresh store of ours (`lmz add`, default codecs), one `lmz add --fast` makes (zstd and byte
grouping only: the faster decode for the larger store) and one of lmzip's. Every timed run gets a fresh
mount, with the store's files read into the page cache just before (as bench/mount_table.py
does), so what is measured is decoding and serving, not the disk; the order of the targets
rotates from run to run. Per run: the file read front to back in 1 MiB reads (cold, SHA-256
checked in run 1), then, on another fresh mount, GGUFReader + a copy of every tensor's data.
Ratios are taken within a run (target vs lmzip's mount, and vs the plain file) and their median
reported.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import describe, fetch_corpus, log, read_sequential, sha256_file, warm_page_cache  # noqa: E402
from mount_table import load_gguf  # noqa: E402
from tools import lmzfs_store, lmzip_store  # noqa: E402

TARGETS = ("plain file (page cache)", "lmzfs mount", "lmzfs mount, `add --fast` store", "lmzip mount")


@contextlib.contextmanager
def served(target: str, tool, store: Path | None, plain: Path, work: Path, n: list[int]):
    """The plain file, or the file through a fresh mount of the store (its files warmed first)."""
    if tool is None:
        yield plain
        return
    warm_page_cache([store])
    n[0] += 1
    mnt = work / f"mnt-{n[0]}"
    try:
        with tool.mount(store, mnt, work / f"mount-{n[0]}.log") as m:
            yield tool.served(m.path, "bench", plain.name)
    finally:
        with contextlib.suppress(OSError):
            mnt.rmdir()


def measure_file(path: Path, runs: int, work: Path) -> dict:
    tools = {"lmzfs mount": lmzfs_store(), "lmzfs mount, `add --fast` store": lmzfs_store("--fast"),
             "lmzip mount": lmzip_store()}
    stores: dict[str, Path] = {}
    res: dict = {"file": path.name, "bytes": path.stat().st_size, "runs": runs, "seq_cold_s": {}, "gguf_load_s": {}}
    for label, tool in tools.items():
        store = work / ("store-" + "-".join(w.strip("-") for w in tool.name.split()))
        start = time.perf_counter()
        tool.add(store, [path], "bench", work)
        log(f"gguf mount: {path.name}: {tool.name} added in {time.perf_counter() - start:.1f} s")
        stores[label] = store
    digest = sha256_file(path)
    counter = [0]
    for i in range(runs):
        order = TARGETS[i % len(TARGETS):] + TARGETS[:i % len(TARGETS)]
        for label in order:
            tool, store = tools.get(label), stores.get(label)
            with served(label, tool, store, path, work, counter) as p:
                nbytes, cold = read_sequential(p)
                if nbytes != path.stat().st_size:
                    raise common.ToolError(f"{label}: served {nbytes} of {path.stat().st_size} bytes")
                if i == 0 and tool is not None and sha256_file(p) != digest:
                    raise common.ToolError(f"{label}: served bytes differ from the original (SHA-256)")
            with served(label, tool, store, path, work, counter) as p:
                start = time.perf_counter()
                load_gguf(p)
                load = time.perf_counter() - start
            res["seq_cold_s"].setdefault(label, []).append(cold)
            res["gguf_load_s"].setdefault(label, []).append(load)
            log(f"gguf mount: {path.name} run {i + 1}/{runs} {label}: cold read {cold:.2f} s, load {load:.2f} s")
    size = path.stat().st_size
    theirs, lt = res["seq_cold_s"]["lmzip mount"], res["gguf_load_s"]["lmzip mount"]
    lp = res["gguf_load_s"]["plain file (page cache)"]
    res["seq_cold_mbps"] = {t: [size / s / 1e6 for s in v] for t, v in res["seq_cold_s"].items()}
    res["seq_speedup_vs_lmzip"] = {t: statistics.median(b / a for a, b in zip(res["seq_cold_s"][t], theirs))
                                   for t in tools if t != "lmzip mount"}
    res["load_speedup_vs_lmzip"] = {t: statistics.median(b / a for a, b in zip(res["gguf_load_s"][t], lt))
                                    for t in tools if t != "lmzip mount"}
    res["load_time_vs_plain"] = {t: statistics.median(a / b for a, b in zip(res["gguf_load_s"][t], lp)) for t in tools}
    return res


def measure(paths: dict[str, Path | Exception], runs: int, work: Path) -> dict:
    """Every GGUF of `paths` (corpus name -> file, or why it could not be had), each in its own
    directory under work; what bench/run.py's GGUF mount section holds."""
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "files": {}}
    for name, path in paths.items():
        sub = work / name
        sub.mkdir(parents=True)
        try:
            if isinstance(path, Exception):
                raise path
            out["files"][name] = measure_file(path, runs, sub)
        except Exception as exc:
            out["files"][name] = {"error": describe(exc)}
            log(f"gguf mount: {name}: {describe(exc)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=["smollm2-q4km", "smollm2"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the results here (default: stdout)")
    ap.add_argument("--tmpdir", type=Path, help="where stores and mounts go (default: system temp)")
    args = ap.parse_args(argv)
    paths: dict[str, Path | Exception] = {}
    for name in args.names:
        try:
            paths[name] = fetch_corpus(name)
        except Exception as exc:
            paths[name] = exc
    with tempfile.TemporaryDirectory(prefix="lmz-gguf-mount-", dir=args.tmpdir) as tmp:
        out = measure(paths, args.runs, Path(tmp))
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
