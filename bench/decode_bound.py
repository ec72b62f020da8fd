#!/usr/bin/env python3
"""The decode bound of a mount: how fast this host decodes one stored file's chunks with no FUSE
in between, in the same run as the mount table.

Runs in the project's venv (it imports lmzfs; `make bench` points PYTHONPATH at its frozen copy):

    .venv/bin/python bench/decode_bound.py --store DIR --model M --file PATH [--threads N] [--runs R]

After one uncounted run, each run reads and decodes every chunk of the file once, with the
read check a mount makes (chunkread.read_chunk: XXH3-128 of the plain bytes), in N threads
taking chunks in file order from one queue, as a mount's decode threads do. Prints JSON: MB/s of plain bytes per run, and
the CPU seconds of the process per run (both threads together). A mount's cold sequential read
can at best match this: it decodes the same chunks and also copies every byte into the kernel.
The host's speed moves by up to 2x over a day, so the mount table's MB/s are best read against
this figure from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path


def one_run(store: Path, model: str, path: str, threads: int) -> tuple[int, float, float]:
    """(plain bytes, wall seconds, process CPU seconds) of decoding the file's chunks once."""
    from lmzfs.store.catalog import Catalog
    from lmzfs.store.read.chunkread import read_chunk
    from lmzfs.store.layout import StorePaths
    from lmzfs.store.read.packfds import PackDescriptors

    paths = StorePaths(store)
    catalog = Catalog(paths.catalog, readonly=True)
    packs = PackDescriptors(paths)
    try:
        row = next((f for f in catalog.files(model) if f.path == path), None)
        if row is None:
            raise SystemExit(f"decode_bound: no file {model}/{path} in {store}")
        extents = catalog.extents(row.id)
        fds = packs.acquire({e.location.pack for e in extents})
        lock = threading.Lock()
        nxt = [0]
        done = [0]
        errors: list[BaseException] = []

        def work() -> None:
            try:
                while True:
                    with lock:
                        i = nxt[0]
                        nxt[0] += 1
                    if i >= len(extents):
                        return
                    e = extents[i]
                    got = len(read_chunk(fds[e.location.pack], e))
                    with lock:
                        done[0] += got
            except BaseException as exc:    # reported after join
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        cpu, start = time.process_time(), time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        packs.release(fds)
        if errors:
            raise errors[0]
        if done[0] != row.size:
            raise SystemExit(f"decode_bound: decoded {done[0]} bytes of {row.size}")
        return done[0], wall, cpu
    finally:
        packs.close()
        catalog.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True, help="the file's path inside the model")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from lmzfs.malloc import tune_malloc
    tune_malloc()       # as the mount's process does: decode buffers reused, not mapped afresh
    out = {"threads": args.threads, "mbps": [], "cpu_s": [], "bytes": 0}
    one_run(args.store, args.model, args.file, args.threads)    # uncounted: imports, first page faults
    for _ in range(args.runs):
        n, wall, cpu = one_run(args.store, args.model, args.file, args.threads)
        out["bytes"] = n
        out["mbps"].append(n / wall / 1e6)
        out["cpu_s"].append(cpu)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
