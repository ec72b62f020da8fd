#!/usr/bin/env python3
"""Delta codecs on a chain of checkpoints: what each one stores per step, and how fast it decodes.

Runs in the project's venv (it imports lmzfs):

    .venv/bin/python bench/delta_codecs.py [--speed] [--json OUT] FILE1 FILE2 [FILE3 ...]

Each file after the first is coded against the one before it (a chain, each checkpoint against
its predecessor): every chunk of a tensor that has a same-named tensor of the same dtype and size
in the previous file (chunks planned exactly as `lmz add` plans them) is coded alone (the best
standalone codec, as `lmz add` chooses: floatsplit for floats, entropy for int8) and against the
previous file's chunk at the same offset with each delta codec; other chunks count as coded alone.
Reported per step: plain bytes, weights (elements of the paired tensors), the payload bytes of
each way and its bits per weight, and "best": per chunk the smaller of coded alone and the best
delta, which is what a store keeps. With --speed, decode MB/s per core (CPU seconds of this one
thread, best of three) of each delta codec and of the standalone payloads of the same chunks. Last, the chain's totals: every file coded alone, and
the first coded alone with each later one as its per-chunk best against its predecessor.
"""
from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from pathlib import Path


def _chunks(path: Path) -> dict:
    from lmzfs.chunker import plan_chunks
    from lmzfs.formats import parse_file

    layout = parse_file(path)
    out = {}
    names = {}
    for seg in layout.segments:
        if seg.kind == "tensor":
            names[seg.offset] = seg
    data = path.read_bytes()
    seg_at = sorted(names)
    # the n-th segment of a (name, dtype, length): coalesced runs of small tensors can share a name
    nth, seen = {}, {}
    for off in seg_at:
        seg = names[off]
        k = (seg.name, seg.dtype, seg.length)
        nth[off] = seen[k] = seen.get(k, -1) + 1
    for p in plan_chunks(layout):
        key = None
        i = bisect.bisect_right(seg_at, p.offset) - 1
        if p.hint.dtype and i >= 0:
            seg = names[seg_at[i]]
            key = (seg.name, seg.dtype, seg.length, nth[seg.offset], p.offset - seg.offset)
        out[key if key else ("@", p.offset)] = (data[p.offset:p.offset + p.length], p.hint)
    assert sum(len(d) for d, _ in out.values()) == len(data), f"{path}: chunks lost in pairing"
    return out


def _best_decode(items, runs: int = 3) -> float:
    from lmzfs.codecs import decode_chunk
    best = float("inf")
    for _ in range(runs):
        t = time.thread_time()
        for payload, size, ref in items:
            decode_chunk(payload, size, ref=ref)
        best = min(best, time.thread_time() - t)
    return best


def measure_step(prev: dict, cur: dict, speed: bool) -> dict:
    from lmzfs.codecs import DELTA_CODECS, decode_chunk, encode_chunk, encode_delta_with

    row = {"plain": 0, "weights": 0, "alone": 0, "best": 0, "paired_plain": 0}
    delta_bytes = {c.name: 0 for c in DELTA_CODECS}
    alone_items, delta_items = [], {c.name: [] for c in DELTA_CODECS}
    encode_s = {c.name: 0.0 for c in DELTA_CODECS}
    for key, (data, hint) in cur.items():
        alone = encode_chunk(data, hint).payload
        row["plain"] += len(data)
        row["alone"] += len(alone)
        ref = prev.get(key, (None,))[0] if key[0] != "@" else None
        if ref is None or len(ref) != len(data):
            row["best"] += len(alone)
            for c in DELTA_CODECS:
                delta_bytes[c.name] += len(alone)
            continue
        row["paired_plain"] += len(data)
        row["weights"] += len(data) // max(1, hint.itemsize or 1)
        alone_items.append((alone, len(data), None))
        best = len(alone)
        for c in DELTA_CODECS:
            t = time.thread_time()
            try:
                payload = encode_delta_with(c, data, ref, hint)
            except ValueError:
                payload = alone
            encode_s[c.name] += time.thread_time() - t
            if payload is not alone:
                if decode_chunk(payload, len(data), ref=ref) != data:
                    raise SystemExit(f"{c.name}: chunk {key} does not decode to its plain bytes")
                delta_items[c.name].append((payload, len(data), ref))
            delta_bytes[c.name] += len(payload)
            best = min(best, len(payload))
        row["best"] += best
    row.update({f"{k}": v for k, v in delta_bytes.items()})
    w = max(1, row["weights"])
    row["bits_per_weight"] = {k: round(8 * row[k] / w, 3) for k in ("alone", "best", *delta_bytes)}
    if speed:
        mb = lambda items, s: round(sum(i[1] for i in items) / s / 1e6, 1) if items and s > 0 else None
        row["decode_mb_s"] = {"alone": mb(alone_items, _best_decode(alone_items))}
        for name, items in delta_items.items():
            row["decode_mb_s"][name] = mb(items, _best_decode(items))
        row["encode_mb_s"] = {name: mb(items, encode_s[name]) for name, items in delta_items.items()}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if len(args.files) < 2:
        print("delta_codecs: give at least two files (a chain)", file=sys.stderr)
        return 2
    from lmzfs.codecs import encode_chunk
    rows = []
    prev = _chunks(args.files[0])
    first = {"file": str(args.files[0]), "plain": sum(len(d) for d, _ in prev.values()),
             "alone": sum(len(encode_chunk(d, h).payload) for d, h in prev.values())}
    print(json.dumps(first), flush=True)
    for path in args.files[1:]:
        cur = _chunks(path)
        row = {"file": str(path), **measure_step(prev, cur, args.speed)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        prev = cur
    total = {"chain_plain": first["plain"] + sum(r["plain"] for r in rows),
             "chain_alone": first["alone"] + sum(r["alone"] for r in rows),
             "chain_first_alone_then_best_delta": first["alone"] + sum(r["best"] for r in rows)}
    print(json.dumps(total), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"first": first, "steps": rows, "total": total}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
