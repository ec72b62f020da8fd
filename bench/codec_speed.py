#!/usr/bin/env python3
"""Codec speed per core: what one core spends to encode and decode the chunks `lmz add` makes.

Runs in the project's venv (it imports lmzfs; `make bench` points PYTHONPATH at its frozen copy):

    .venv/bin/python bench/codec_speed.py [--every 4] [--runs 3] [--json OUT] [NAME ...]

For each corpus file: parse it, plan its chunks exactly as `lmz add` does, take every k-th chunk
(a fixed, spread-out sample), encode each with the default codecs, then decode the sample `runs`
times. Times are CPU seconds of this one thread (time.thread_time), so other load on a shared
machine moves them far less than wall time; the figure is the best run. Reported per file:

- encode MB/s per core, decode MB/s per core, decode + the read check a mount makes of each chunk
  it serves (XXH3-128 of the plain bytes, codec CRC skipped, as chunkread.read_chunk does), and
  decode + SHA-256 (the check of chunks stored before lmzfs kept read checksums, and of `lmz
  verify`), all in MB of plain bytes;
- the same decode with the compiled loop's scalar steps, where it runs vector (AVX-512) ones;
- the same decode through the numpy tANS loop (the path used when the C loop is not built), on a
  sparser sample because it is slow;
- the saved % of the sample (close to, not equal to, the whole file's).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path


def measure_file(path: Path, every: int, runs: int) -> dict:
    from lmzfs.chunker import plan_chunks
    from lmzfs.codecs import REGISTRY, decode_chunk, encode_chunk, kernels, parse_payload
    from lmzfs.formats import parse_file
    import xxhash

    plans = list(plan_chunks(parse_file(path)))[::every]
    plain, payloads = [], []
    encode_s = 0.0
    with open(path, "rb") as f:
        for p in plans:
            f.seek(p.offset)
            data = f.read(p.length)
            t = time.thread_time()
            enc = encode_chunk(data, p.hint)
            encode_s += time.thread_time() - t
            plain.append(data)
            payloads.append(enc.payload)
    total = sum(len(d) for d in plain)
    stored = sum(len(p) for p in payloads)
    codecs: dict[str, int] = {}
    for d, p in zip(plain, payloads):
        name = REGISTRY[parse_payload(p).codec_id].name
        codecs[name] = codecs.get(name, 0) + len(d)

    def best_decode(indices: list[int], check: str | None) -> float:
        best = float("inf")
        for _ in range(runs):
            t = time.thread_time()
            for i in indices:
                out = decode_chunk(payloads[i], len(plain[i]), hash_checked=check is not None)
                if check == "sha256":
                    hashlib.sha256(out).digest()
                elif check == "xxh3":
                    xxhash.xxh3_128_digest(out)
            best = min(best, time.thread_time() - t)
        return best

    every_index = list(range(len(plain)))
    for i in every_index:           # correctness first, and a warm-up
        if decode_chunk(payloads[i], len(plain[i])) != plain[i]:
            raise SystemExit(f"{path.name}: chunk {i} does not decode to its plain bytes")
    dec = best_decode(every_index, None)
    loop = kernels.compiled()
    steps = loop.vector_isa() if loop is not None else None
    dec_scalar = None
    if steps not in (None, "off"):      # the same decode with the compiled loop's scalar steps
        with kernels.scalar_steps():
            dec_scalar = best_decode(every_index, None)
    dec_read = best_decode(every_index, "xxh3")
    dec_verify = best_decode(every_index, "sha256")
    sparse = every_index[::4]
    sparse_bytes = sum(len(plain[i]) for i in sparse)
    with kernels.reference_only():
        dec_numpy = best_decode(sparse, None) if sparse else None
    mb = 1e6
    return {
        "file": path.name, "sample_chunks": len(plain), "sample_bytes": total, "every": every,
        "saved_pct": 100.0 * (1 - stored / total) if total else 0.0,
        "plain_bytes_by_codec": codecs,
        "encode_mbps": total / encode_s / mb if encode_s else None,
        "decode_mbps": total / dec / mb if dec else None,
        "decode_read_mbps": total / dec_read / mb if dec_read else None,
        "decode_verify_mbps": total / dec_verify / mb if dec_verify else None,    # + SHA-256
        "numpy_decode_mbps": sparse_bytes / dec_numpy / mb if dec_numpy else None,
        "scalar_steps_decode_mbps": total / dec_scalar / mb if dec_scalar else None,
        "compiled_loop": loop is not None,
        "step_loop": steps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=["minilm", "smollm2", "astra", "isnet", "quire"])
    ap.add_argument("--every", type=int, default=4, help="take every k-th chunk (default 4)")
    ap.add_argument("--runs", type=int, default=3, help="decode runs; the best counts (default 3)")
    ap.add_argument("--json", type=Path, help="write the results here (default: stdout)")
    args = ap.parse_args(argv)
    from lmzfs.malloc import tune_malloc
    from lmzfs.testing.corpus import fetch
    tune_malloc()        # as in every lmzfs process that decodes
    res = {"every": args.every, "runs": args.runs, "files": {}}
    for name in args.names:
        print(f"codec speed: {name}", file=sys.stderr, flush=True)
        res["files"][name] = measure_file(Path(fetch(name)), args.every, args.runs)
    text = json.dumps(res, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
