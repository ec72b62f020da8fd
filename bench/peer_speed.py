#!/usr/bin/env python3
"""The peers' codec speed per core, for the codec-speed table: lmzip and ZipNN on one thread.

Runs in the bench venv (lmzip's `lmz` and zipnn live there), inside `make bench` or alone:

    bench/.venv/bin/python bench/peer_speed.py [--runs 3] [NAME ...]

MB of the original file per CPU second, the same unit as bench/codec_speed.py's figures for
lmzfs (which time its codecs on one thread, without reading or writing files):

- lmzip: `lmz compress -j 1` and `lmz decompress -j 1` of the file, each a whole process; its CPU
  seconds (user + system, from the kernel's accounting of the finished child) less the CPU
  seconds of `lmz --version` (the interpreter's start-up and imports, best of 3), so that what
  is left is reading, coding and writing the file.
- ZipNN: its Python API in this process with `threads=1`, byte mode, streaming in 1 MiB chunks
  as the compression table runs it (tools.py), the bytes already in memory; process CPU seconds
  of compress() and of decompress().

Each figure is the best of `runs` runs; every run's output is checked against the original.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LMZIP_CLI, ToolError, describe, fetch_corpus, log, run  # noqa: E402
from tools import safetensors_float_dtype  # noqa: E402


def _child_cpu_s(argv: list) -> float:
    """CPU seconds (user + system) of running argv to completion as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run(argv, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def lmzip_startup_cpu_s() -> float:
    return min(_child_cpu_s([LMZIP_CLI, "--version"]) for _ in range(3))


def measure_lmzip(path: Path, work: Path, runs: int, startup: float) -> dict:
    arc, out = work / "peer.lmz", work / "peer.out"
    enc = dec = float("inf")
    want = path.read_bytes()
    for _ in range(runs):
        enc = min(enc, _child_cpu_s([LMZIP_CLI, "compress", "-j", "1", "-q", "-f", path, arc]) - startup)
        dec = min(dec, _child_cpu_s([LMZIP_CLI, "decompress", "-j", "1", "-q", "-f", arc, out]) - startup)
        if out.read_bytes() != want:
            raise ToolError(f"lmzip: {path.name} does not round-trip")
    n = path.stat().st_size
    arc.unlink()
    out.unlink()
    return {"encode_mbps": n / enc / 1e6, "decode_mbps": n / dec / 1e6, "threads": 1,
            "startup_cpu_s": startup}


def measure_zipnn(path: Path, runs: int) -> dict:
    from zipnn import ZipNN
    dtype = safetensors_float_dtype(path) or "float32"
    want = path.read_bytes()
    enc = dec = float("inf")
    for _ in range(runs):
        data = bytearray(want)        # compress rewrites its input in place
        t = time.process_time()
        packed = ZipNN(bytearray_dtype=dtype, is_streaming=True, threads=1).compress(data)
        enc = min(enc, time.process_time() - t)
        t = time.process_time()
        back = ZipNN(bytearray_dtype=dtype, is_streaming=True, threads=1).decompress(packed)
        dec = min(dec, time.process_time() - t)
        if bytes(back) != want:
            raise ToolError(f"zipnn: {path.name} does not round-trip")
    n = len(want)
    return {"encode_mbps": n / enc / 1e6, "decode_mbps": n / dec / 1e6, "threads": 1, "dtype": dtype}


def measure(paths: dict[str, Path], runs: int, work: Path) -> dict:
    """Per file: {"lmzip": {...} or {"error"}, "zipnn": {...} or {"error"}}."""
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"runs": runs, "files": {}}
    try:
        startup = lmzip_startup_cpu_s()
    except ToolError as exc:
        startup = exc
    for name, path in paths.items():
        log(f"peer speed per core: {name}")
        row = res["files"][name] = {}
        try:
            if isinstance(startup, Exception):
                raise startup
            row["lmzip"] = measure_lmzip(path, work, runs, startup)
        except Exception as exc:
            row["lmzip"] = {"error": describe(exc)}
        try:
            row["zipnn"] = measure_zipnn(path, runs)
        except Exception as exc:
            row["zipnn"] = {"error": describe(exc)}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=["minilm", "smollm2", "astra", "isnet", "quire"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/lmz-peer-speed"))
    args = ap.parse_args(argv)
    print(json.dumps(measure({n: fetch_corpus(n) for n in args.names}, args.runs, args.work), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
