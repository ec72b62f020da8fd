"""The mount table: reading a model through our mount vs lmzip's mount vs the plain file.

Targets: the plain file in the page cache (the anchor of every ratio), our mount (`lmz --store S
mount MNT --cache-size C`, on the default store and on the stores `lmz add --fast`, `lmz add
--chunk-size 256K`, `lmz add --chunk-size 1M`, `lmz add --no-segments` and `lmz add --fast
--chunk-size 256K` make), and lmzip's
mount. Every timed cold read gets a fresh mount, with the store's own files read into the
page cache just before, so what is measured is decoding and serving, not the disk. Runs are
interleaved over targets, and each ratio is taken within one run (target vs the plain file in
that same run), then summarised over runs.

Measurements, each on a fresh mount:
  seq      the astra file (BF16, 235 MB) read front to back in 1 MiB reads (cold), then read again
           through the same mount (warm: the kernel page cache of the mount), then once more
           (warm again: the first re-read also pays the kernel's one-time move of each cached
           page to its active list, which the plain file, read many times before, no longer
           does), SHA-256 checked in run 1
  rand     N preads of 4 KiB at random 4 KiB-aligned offsets of astra (same offsets for every
           target in a run), each timed with perf_counter_ns; p50 and p99
  conc     one reader of one astra-like file, then (fresh mount) one reader of 8 different
           astra-like files one after another (astra with the low mantissa bits of every element
           XORed with 1..8: same size and compressibility, no shared chunks), then (fresh mount)
           8 threads reading those 8 files at once; total MB/s, and the daemon's VmHWM/VmRSS
           (/proc/PID/status; our pid from MNT/.lmzfs/stats.json) right after the 8 readers
  rss      our mount's VmHWM after the same 8-reader stream (1.9 GB) at other --cache-size values
  load     safetensors.safe_open(framework="pt") + get_tensor of every tensor of astra (the
           tensors are views of safetensors' mmap: only the pages the loader itself touches are
           read), the same with a copy of every tensor (every byte read: what a model load does),
           and gguf.GGUFReader + a copy of every tensor's data of smollm2
  ceiling  our default mount reading random bytes of astra's size (incompressible, so stored
           raw: a read costs its checksum and the FUSE path, no decoding), cold: the most
           any codec could reach through this daemon on this host
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

import common
from common import (ToolError, describe, help_text, log, percentile, proc_memory,
                    read_sequential, sha256_file, warm_page_cache)
from tools import CliStore, lmzfs_store, lmzip_store

DEFAULT_CACHE = "256M"
SMALL_CHUNKS = "256K"                  # `lmz add --chunk-size` of the third store of ours
UNIFORM_CHUNKS = "1M"                   # and of the fourth: every segment at 1 MiB, as stores made before
                                        # stores recorded their sizes cut (a new one cuts floats at 4 MiB)
RSS_CACHE_SIZES = ("64M",)            # measured besides DEFAULT_CACHE
VARIANTS = 8
BLOCK = 4096


@dataclass
class Target:
    label: str
    kind: str                          # "plain", "ours" or "lmzip"
    tool: CliStore | None = None
    extra: list[str] = field(default_factory=list)
    store: Path | None = None
    error: str | None = None
    cache_size: str | None = None

    def info(self) -> dict:
        return {"label": self.label, "kind": self.kind, "extra": self.extra, "error": self.error,
                "cache_size": self.cache_size}


@dataclass
class Session:
    path: Callable[[str, str], Path]   # (model, file name) -> the file to read
    pid: int | None = None
    ready_s: float | None = None
    stats: dict | None = None


def make_variants(src: Path, dest: Path, count: int) -> list[Path]:
    """`count` distinct safetensors files like `src`: every 16-bit word of the data section XORed
    with k (1..count), which flips only the lowest mantissa bits of BF16 values: the same size,
    dtype mix and compressibility, and no chunk in common with `src` or with each other."""
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    raw = bytearray(src.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    start = 8 + hlen
    if start % 2 or (len(raw) - start) % 2:
        raise ToolError(f"{src.name}: data section not 16-bit aligned")
    words = np.frombuffer(raw, dtype="<u2", offset=start)
    out = []
    for k in range(1, count + 1):
        p = dest / f"{src.stem}.v{k}{src.suffix}"
        with open(p, "wb") as f:
            f.write(raw[:start])
            f.write((words ^ np.uint16(k)).tobytes())
        out.append(p)
    return out


def make_incompressible(like: Path, dest: Path) -> Path:
    """Seeded random bytes of `like`'s size, under dest (no codec can shrink them)."""
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    p = dest / "incompressible.bin"
    p.write_bytes(np.random.default_rng(20261201).bytes(like.stat().st_size))
    return p


def _read_all(paths: list[Path]) -> tuple[int, float]:
    """Read the files concurrently, one thread each; (total bytes, wall seconds)."""
    barrier = threading.Barrier(len(paths) + 1)
    counts = [0] * len(paths)
    errors: list[BaseException] = []

    def worker(i: int, p: Path) -> None:
        barrier.wait()
        try:
            counts[i] = read_sequential(p)[0]
        except BaseException as exc:   # reported after join
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(paths)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts), elapsed


def _random_reads(path: Path, offsets: list[int]) -> list[int]:
    """Nanoseconds of each 4 KiB pread at these offsets."""
    lat = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in offsets:
            t0 = time.perf_counter_ns()
            b = os.pread(fd, BLOCK, off)
            lat.append(time.perf_counter_ns() - t0)
            if len(b) != BLOCK:
                raise ToolError(f"short read at {off}: {len(b)} bytes")
    finally:
        os.close(fd)
    return lat


def _check_random(path: Path, plain: Path, offsets: list[int]) -> None:
    with open(path, "rb", buffering=0) as a, open(plain, "rb", buffering=0) as b:
        for off in offsets:
            if os.pread(a.fileno(), BLOCK, off) != os.pread(b.fileno(), BLOCK, off):
                raise ToolError(f"random read at {off} differs from the original")


def load_safetensors(path: Path, copy: bool = False) -> int:
    """Tensor bytes loaded; with copy, each tensor is copied out of the mapping (every byte read)."""
    from safetensors import safe_open
    n = 0
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if copy:
                t = t.clone()
            n += t.numel() * t.element_size()
            del t
    return n


def load_gguf(path: Path) -> int:
    import numpy as np
    from gguf import GGUFReader
    reader = GGUFReader(str(path))
    n = 0
    for t in reader.tensors:
        n += len(np.asarray(t.data).tobytes())
    del reader, t
    gc.collect()             # drop the memmap before the mount goes away
    return n


class MountBench:
    def __init__(self, astra: Path, gguf: Path, work: Path, runs: int, reads: int):
        self.astra, self.gguf, self.work, self.runs, self.reads = astra, gguf, work, runs, reads
        self.variants: list[Path] = []
        self.targets: list[Target] = []
        self.plain: dict[tuple[str, str], Path] = {}
        self._n = 0
        self.res: dict = {"runs": runs, "reads": reads, "variants": VARIANTS, "default_cache": DEFAULT_CACHE,
                          "file": {"name": astra.name, "bytes": astra.stat().st_size},
                          "gguf": {"name": gguf.name, "bytes": gguf.stat().st_size},
                          "seq": {}, "rand": {}, "conc": {}, "rss": [], "load": {}, "ceiling": {}, "errors": []}
        self.ceiling: Target | None = None
        self.default_store: Path | str | None = None     # our default store, or why it is missing

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        log("mount: making distinct astra variants")
        self.variants = make_variants(self.astra, self.work / "variants", VARIANTS)
        self.res["variant_bytes"] = sum(p.stat().st_size for p in self.variants)
        self.plain = {("bench", self.astra.name): self.astra, ("bench", self.gguf.name): self.gguf}
        self.plain.update({("astra8", p.name): p for p in self.variants})
        self.targets = [Target("plain file (page cache)", "plain")]
        ours, ours_fast, theirs = lmzfs_store(), lmzfs_store("--fast"), lmzip_store()
        ours_small = lmzfs_store("--chunk-size", SMALL_CHUNKS)
        ours_fast_small = lmzfs_store("--fast", "--chunk-size", SMALL_CHUNKS)
        ours_whole = lmzfs_store("--no-segments")
        ours_uniform = lmzfs_store("--chunk-size", UNIFORM_CHUNKS)
        self.targets.append(Target("lmzfs mount", "ours", ours, ["--cache-size", DEFAULT_CACHE],
                                   cache_size=DEFAULT_CACHE))
        # the store `lmz add --fast` makes (zstd and byte grouping only)
        self.targets.append(Target("lmzfs mount, `add --fast` store", "ours", ours_fast,
                                   ["--cache-size", DEFAULT_CACHE], cache_size=DEFAULT_CACHE))
        # the default codecs with smaller chunks: what a cache miss (a random read) costs less
        self.targets.append(Target(f"lmzfs mount, `add --chunk-size {SMALL_CHUNKS}` store", "ours", ours_small,
                                   ["--cache-size", DEFAULT_CACHE], cache_size=DEFAULT_CACHE))
        # float chunks at 1 MiB rather than the default 4 MiB (a store made before sizes were recorded):
        # each chunk's tables and per-chunk work spread over a quarter of the bytes
        self.targets.append(Target(f"lmzfs mount, `add --chunk-size {UNIFORM_CHUNKS}` store", "ours", ours_uniform,
                                   ["--cache-size", DEFAULT_CACHE], cache_size=DEFAULT_CACHE))
        # float chunks coded whole (floatsplit), not in segments that a lone small read decodes alone
        self.targets.append(Target("lmzfs mount, `add --no-segments` store", "ours", ours_whole,
                                   ["--cache-size", DEFAULT_CACHE], cache_size=DEFAULT_CACHE))
        # both: what a random-access workload would choose (small misses, decoded without a thread hop)
        self.targets.append(Target(f"lmzfs mount, `add --fast --chunk-size {SMALL_CHUNKS}` store", "ours",
                                   ours_fast_small, ["--cache-size", DEFAULT_CACHE], cache_size=DEFAULT_CACHE))
        self.targets.append(Target("lmzip mount", "lmzip", theirs, [], cache_size="512 blocks x 64 KiB per model (default)"))
        stores: dict[str, Path | str] = {}
        for tool in (ours, ours_fast, ours_small, ours_uniform, ours_whole, ours_fast_small, theirs):
            store = self.work / ("store-" + "-".join(w.strip("-") for w in tool.name.split()))
            try:
                start = time.perf_counter()
                tool.add(store, [self.astra, self.gguf], "bench", self.work)
                # standalone: lmzfs would otherwise pair the variants' tensors with astra's (same
                # names and shapes) and recode astra as deltas against them, and every astra row
                # below would measure a delta chain instead of the model stored alone
                tool.add(store, self.variants, "astra8", self.work, standalone=True)
                log(f"mount: {tool.name}: both models added in {time.perf_counter() - start:.1f} s")
                stores[tool.name] = store
            except Exception as exc:
                stores[tool.name] = describe(exc)
        for t in self.targets:
            if t.tool is not None:
                s = stores[t.tool.name]
                if isinstance(s, Path):
                    t.store = s
                else:
                    t.error = f"setting up the store failed: {s}"
        self.res["targets"] = [t.info() for t in self.targets]
        self.default_store = stores.get(ours.name)
        self.setup_ceiling(ours)
        ours_default = Target("lmzfs mount (no options)", "ours", ours, [], store=self.default_store)
        if isinstance(ours_default.store, Path):
            try:
                with self.session(ours_default) as s:
                    self.res["default_cache_bytes"] = (s.stats or {}).get("cache", {}).get("capacity_bytes")
            except Exception as exc:
                self.res["errors"].append(f"mount with default options: {describe(exc)}")

    def setup_ceiling(self, ours: CliStore) -> None:
        """A store of incompressible bytes of astra's size, for the serving ceiling."""
        self.ceiling = Target("lmzfs mount, incompressible bytes", "ours", ours, ["--cache-size", DEFAULT_CACHE],
                              cache_size=DEFAULT_CACHE)
        try:
            random_file = make_incompressible(self.astra, self.work / "ceiling")
            self.res["ceiling_file"] = {"name": random_file.name, "bytes": random_file.stat().st_size,
                                        "sha256": sha256_file(random_file)}
            self.ceiling.store = self.work / "store-ceiling"
            ours.add(self.ceiling.store, [random_file], "ceiling", self.work)
        except Exception as exc:
            self.ceiling.error = f"setting up the store failed: {describe(exc)}"

    # ------------------------------------------------------------------ sessions

    @contextlib.contextmanager
    def session(self, t: Target, extra: list[str] | None = None) -> Iterator[Session]:
        """The plain files, or a fresh mount of the target's store (its files warmed first)."""
        if t.tool is None:
            yield Session(lambda model, name: self.plain[(model, name)])
            return
        warm_page_cache([t.store])
        self._n += 1
        mnt = self.work / f"mnt-{t.kind}-{self._n}"
        try:
            with t.tool.mount(t.store, mnt, self.work / f"mount-{t.kind}.log", extra if extra is not None else t.extra) as m:
                pid, stats = m.proc.pid, None
                if t.kind == "ours":
                    stats = json.loads((m.path / ".lmzfs" / "stats.json").read_text())
                    pid = int(stats["pid"])
                yield Session(lambda model, name: t.tool.served(m.path, model, name), pid, m.ready_s, stats)
        finally:
            with contextlib.suppress(OSError):
                mnt.rmdir()

    def _each(self, what: str, fn: Callable[[Target, int], dict], targets: list[Target] | None = None) -> None:
        """Run fn(target, run) for every run and target (interleaved; the mount targets unless
        `targets` names others); keep per-run values, None on failure.

        Each run starts at another target (the order rotates by len(targets) / runs): in two
        runs on 2 Dec 2026 every row measured early in the first run was 2-4x slower than in the
        later runs (the first run of the sequential phase took 15 s against 8-9), for reasons
        outside the daemon that a sync before it did not remove, and a fixed order gave that
        cost to our rows every time and lmzip's, measured last, hardly at all."""
        table = self.res[what]
        every = list(self.targets if targets is None else targets)
        step = max(1, len(every) // max(1, self.runs))
        for i in range(self.runs):
            k = (i * step) % len(every) if every else 0
            for t in every[k:] + every[:k]:
                row = table.setdefault(t.label, {"error": t.error})
                if t.error:
                    continue
                log(f"mount {what}: {t.label} run {i + 1}/{self.runs}")
                try:
                    vals = fn(t, i)
                except Exception as exc:
                    row["error"] = describe(exc)
                    log(f"mount {what}: {t.label}: {row['error']}")
                    vals = {}
                for k, v in vals.items():
                    row.setdefault(k, [None] * self.runs)[i] = v

    # ------------------------------------------------------------------ measurements

    @cached_property
    def astra_sha256(self) -> str:
        """The original's digest, hashed once for every target's check (like the ceiling file's)."""
        return sha256_file(self.astra)

    def warm_up(self) -> None:
        """One cold read through every target, not counted. Right after the stores are built,
        each of three runs on 2 Dec 2026 found the first ~15 s of reads 2-4x slower for whatever
        was read then (a sync before them, and a rotating order, did not remove it; the first run
        of the next phases was not slower), so the first run measured the host, not the tools.
        The cold MB/s are kept in the JSON ("warm_up_mbps") for the record."""
        got = self.res.setdefault("warm_up_mbps", {})
        for t in self.targets:
            if t.error:
                continue
            log(f"mount warm-up: {t.label}")
            try:
                with self.session(t) as s:
                    n, cold = read_sequential(s.path("bench", self.astra.name))
                got[t.label] = n / cold / 1e6
            except Exception as exc:    # the measured runs will report it
                got[t.label] = None
                log(f"mount warm-up: {t.label}: {describe(exc)}")

    def seq(self, t: Target, i: int) -> dict:
        with self.session(t) as s:
            p = s.path("bench", self.astra.name)
            n, cold = read_sequential(p)
            n2, warm = read_sequential(p)
            n3, warm2 = read_sequential(p)
            if n != self.astra.stat().st_size or n2 != n or n3 != n:
                raise ToolError(f"served {n}, {n2} and {n3} bytes of {self.astra.stat().st_size}")
            if i == 0 and t.tool is not None and sha256_file(p) != self.astra_sha256:
                raise ToolError("served bytes differ from the original (SHA-256)")
            return {"cold_s": cold, "warm_s": warm, "warm2_s": warm2, "ready_s": s.ready_s}

    def rand(self, t: Target, i: int) -> dict:
        size = self.astra.stat().st_size
        rng = random.Random(4096 + i)
        offsets = [rng.randrange(0, size // BLOCK) * BLOCK for _ in range(self.reads)]
        with self.session(t) as s:
            p = s.path("bench", self.astra.name)
            lat = sorted(_random_reads(p, offsets))
            if i == 0 and t.tool is not None:
                _check_random(p, self.astra, offsets[:200])
        return {"p50_us": percentile(lat, 50) / 1e3, "p99_us": percentile(lat, 99) / 1e3,
                "mean_us": sum(lat) / len(lat) / 1e3, "max_us": lat[-1] / 1e3}

    def conc(self, t: Target, i: int) -> dict:
        with self.session(t) as s:
            one_bytes, one_s = _read_all([s.path("astra8", self.variants[0].name)])
        out = {"one_s": one_s, "one_bytes": one_bytes}
        # The same 8 files as the 8 readers, read by one reader one after another: the same work
        # and about as long, where the one file above takes a tenth of the time (0.3-0.5 s).
        with self.session(t) as s:
            start = time.perf_counter()
            all_bytes = sum(read_sequential(s.path("astra8", p.name))[0] for p in self.variants)
            out.update(one_all_s=time.perf_counter() - start, one_all_bytes=all_bytes)
        if all_bytes != self.res["variant_bytes"]:
            raise ToolError(f"1 reader of the 8 files got {all_bytes} bytes of {self.res['variant_bytes']}")
        out.update(self._eight(t, t.extra))
        return out

    def _eight(self, t: Target, extra: list[str]) -> dict:
        with self.session(t, extra) as s:
            total, secs = _read_all([s.path("astra8", p.name) for p in self.variants])
            if total != self.res["variant_bytes"]:
                raise ToolError(f"8 readers got {total} bytes of {self.res['variant_bytes']}")
            mem = proc_memory(s.pid) if s.pid else None
        return {"eight_s": secs, "eight_bytes": total, "mem": mem}

    def rss(self) -> None:
        """Our mount's memory after the 8-reader stream at other cache sizes (the default's is in conc)."""
        for t in [t for t in self.targets if t.kind == "ours" and not t.error][:1]:   # the default store
            for size in RSS_CACHE_SIZES:
                extra = [a if a != DEFAULT_CACHE else size for a in t.extra]
                row = {"label": t.label, "cache_size": size, "eight_s": [], "mem": [], "error": None}
                for i in range(self.runs):
                    log(f"mount rss: {t.label} --cache-size {size} run {i + 1}/{self.runs}")
                    try:
                        r = self._eight(t, extra)
                        row["eight_s"].append(r["eight_s"])
                        row["mem"].append(r["mem"])
                    except Exception as exc:
                        row["error"] = describe(exc)
                        break
                self.res["rss"].append(row)

    def _timed_load(self, t: Target, name: str, loader: Callable[[Path], int]) -> tuple[int, float]:
        """(bytes loaded, seconds) of loader on file `name`, through a fresh mount of t."""
        with self.session(t) as s:
            start = time.perf_counter()
            n = loader(s.path("bench", name))
            return n, time.perf_counter() - start

    def load(self, t: Target, i: int) -> dict:
        n1, st_s = self._timed_load(t, self.astra.name, load_safetensors)
        n3, copy_s = self._timed_load(t, self.astra.name, lambda p: load_safetensors(p, copy=True))
        n2, gg_s = self._timed_load(t, self.gguf.name, load_gguf)
        if n3 != n1:
            raise ToolError(f"safetensors loads differ: {n1} bytes lazily, {n3} copied")
        return {"safetensors_s": st_s, "safetensors_bytes": n1, "safetensors_copy_s": copy_s,
                "gguf_s": gg_s, "gguf_bytes": n2}

    def ceiling_seq(self, t: Target, i: int) -> dict:
        """A cold sequential read of the incompressible file (SHA-256 checked in run 1)."""
        info = self.res["ceiling_file"]
        with self.session(t) as s:
            p = s.path("ceiling", info["name"])
            n, cold = read_sequential(p)
            if n != info["bytes"] or (i == 0 and sha256_file(p) != info["sha256"]):
                raise ToolError("served bytes differ from the original")
        return {"cold_s": cold}

    def measure(self) -> dict:
        try:
            import safetensors, gguf, torch  # noqa: F401,E401  (imports are not timed)
        except ImportError as exc:
            self.res["errors"].append(f"loaders unavailable: {exc}")
        # The stores were just written: their dirty pages are written back here, not during the
        # first runs (on the host of 2 Dec 2026 it took 0.2 s, too little for their slowness; see
        # warm_up).
        start = time.perf_counter()
        os.sync()
        log(f"mount: stores written back to disk (sync) in {time.perf_counter() - start:.1f} s")
        warm_page_cache([self.astra, self.gguf, *self.variants])
        self.res["order"] = "rotating"      # see _each
        self.warm_up()
        self.decode_bound("start")
        self._each("seq", self.seq)
        self._each("rand", self.rand)
        self._each("conc", self.conc)
        self.rss()
        self._each("load", self.load)
        if self.ceiling:
            self._each("ceiling", self.ceiling_seq, [self.ceiling])
        self.decode_bound("end")
        return self.res

    def decode_bound(self, when: str) -> None:
        """Decoding alone (bench/decode_bound.py): astra's chunks in our default store, decoded
        and checked in-process by as many threads as CPUs, no FUSE; MB/s per run, at the start
        and the end of the measurements (the host's speed drifts)."""
        store = self.default_store
        if not isinstance(store, Path):
            return
        log(f"mount: decode bound ({when})")
        warm_page_cache([store])
        try:
            out = common.run([*common.lmzfs_python(common.LMZFS_FROZEN), str(Path(__file__).parent / "decode_bound.py"),
                              "--store", str(store), "--model", "bench", "--file", self.astra.name,
                              "--runs", str(self.runs)], timeout=600)
            self.res.setdefault("decode_bound", {})[when] = json.loads(out.strip().splitlines()[-1])
        except Exception as exc:
            self.res["errors"].append(f"decode bound ({when}): {describe(exc)}")


def measure(astra: Path, gguf: Path, work: Path, runs: int, reads: int = 2000) -> dict:
    bench = MountBench(astra, gguf, work, runs, reads)
    try:
        bench.setup()
        return bench.measure()
    finally:
        shutil.rmtree(work / "variants", ignore_errors=True)
        shutil.rmtree(work / "ceiling", ignore_errors=True)
