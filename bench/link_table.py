#!/usr/bin/env python3
"""Issue 50: a model over a real link, from the remote store against the plain file.

    .venv/bin/python bench/link_table.py --file astra=PATH [--file NAME=PATH ...] --json OUT.json
        [--lmz LMZFS_CLI] [--runs 2] [--rates 1gbit,2gbit,10gbit,none] [--load-rate 1gbit] [--tmpdir DIR]

Runs in the project's venv (lmzfs, obstore, safetensors, gguf, torch), as root (ip netns, tc,
drop_caches); bench/run.py runs it as its `link` section. It makes a private network namespace
(lmzfs.testing.netns.ShapedLink) and runs itself again inside it (`ip netns exec`), so that the S3
engine (SeaweedFS `weed mini`, lmzfs.testing.seaweed), every mount daemon and every client talk over
that namespace's own 127.0.0.1, the traffic to and from the engine's S3 port shaped by a token
bucket (`tbf rate R burst B latency 20ms`; burst 512 KiB at 1 Gbit/s, scaled with the rate) under
an htb root that passes every other port's packets straight through: `weed mini` runs its S3
gateway, filer and volume server as separate servers on other ports of the same 127.0.0.1, and
its own hops between them must not share the client's link (shaping all of lo halved what a
client got of it). The namespace is deleted and everything in it stopped at the end, whatever
happens.

Inside, one engine for the whole run. Each file goes into one lmzfs store (`lmz add`), pushed to
the engine (`lmz push`'s push()), and is uploaded as it is beside it (the plain object). Then, at
each rate (and unshaped: `none`), --runs times, the order of the two readers rotating:

- plain: the plain object fetched by ranged GETs with obstore (the client lmzfs uses), GETs of the
  mount fetcher's request size, as many at once as its fetch threads, into memory: the best a plain
  fetcher does on this link;
- mount: `lmz mount --remote URL --cache-dir EMPTY --poll 0` (a fresh mount, an empty cache) and the
  file read front to back in 1 MiB reads;

the page cache dropped before each (`sync; echo 3 > /proc/sys/vm/drop_caches`: the engine's data
files too, for both). Bytes on the wire: the shaped class's counter over the read (every packet
to or from the S3 port, both ways, headers included), beside the bytes the mount's fetcher asked for
(.lmzfs/stats.json). At --load-rate, also a real loader: safetensors `safe_open` (torch) + a copy of
every tensor, or gguf.GGUFReader + a copy of every tensor's data: over the remote mount (cold), and
over the plain file fetched first to a local file (the same ranged GETs, written with pwrite) then
loaded: fetch + load.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, describe, log, mounted, read_sequential, run  # noqa: E402

RATES = ("1gbit", "2gbit", "10gbit", "none")
LOAD_RATE = "1gbit"
GOALS = {"astra": 1.3, "minilm": 1.1, "isnet": 1.1}      # cold read × the plain GET stream at 1 Gbit/s
LOAD_GOAL = 1.0


@contextlib.contextmanager
def env_set(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def drop_page_cache() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def load_file(path: Path) -> int:
    """A real loader: every tensor copied out (safetensors with torch; GGUFReader)."""
    if path.suffix == ".gguf":
        import numpy as np
        from gguf import GGUFReader
        reader = GGUFReader(str(path))
        n = 0
        for t in reader.tensors:
            n += len(np.asarray(t.data).tobytes())
        del reader, t
        gc.collect()
        return n
    from safetensors import safe_open
    n = 0
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k).clone()
            n += t.numel() * t.element_size()
            del t
    gc.collect()
    return n


class Inner:
    """The measurements, run inside the namespace."""

    def __init__(self, files: dict[str, Path], lmz: list[str], work: Path, runs: int, rates: list[str],
                 load_rate: str | None):
        from lmzfs.store.remote.fetch import FETCH_THREADS, MAX_GET_BYTES
        self.files, self.lmz, self.work, self.runs = files, lmz, work, runs
        self.rates, self.load_rate = rates, load_rate
        self.get_bytes, self.threads = MAX_GET_BYTES, FETCH_THREADS
        self.store = work / "store"
        self.out: dict = {"files": {n: {"name": p.name, "bytes": p.stat().st_size} for n, p in files.items()},
                          "runs": runs, "get_bytes": MAX_GET_BYTES, "threads": FETCH_THREADS, "rates": {}}

    # -- setup -----------------------------------------------------------------------------------
    def setup(self, eng) -> None:
        from lmzfs.store.layout import StorePaths
        from lmzfs.store.remote.objects import ObjectStore, RemoteURL
        from lmzfs.store.remote.push import push
        self.eng = eng
        for name, path in self.files.items():
            src = self.work / "src" / name
            src.mkdir(parents=True)
            try:
                os.link(path, src / path.name)
            except OSError:
                shutil.copyfile(path, src / path.name)
            log(f"link: lmz add {name}")
            run([*self.lmz, "--store", self.store, "add", src, "--name", name], timeout=3600)
        r = push(StorePaths(self.store), ObjectStore(RemoteURL.parse(eng.url("store"))))
        self.out["stored_bytes"] = r.stored_bytes
        listing = json.loads(run([*self.lmz, "--store", self.store, "ls", "--json"], timeout=600))
        self.out["listing"] = listing
        self.plain = ObjectStore(RemoteURL.parse(eng.url("plain")))
        for name, path in self.files.items():
            self.plain.put(path.name, path.read_bytes())
        import obstore
        self.out["obstore"] = obstore.__version__

    # -- the readers ------------------------------------------------------------------------------
    def plain_stream(self, name: str, dest: Path | None = None) -> float:
        """The plain object by ranged GETs, self.threads at once; into memory, or pwritten to dest."""
        import obstore as obs
        path = self.files[name]
        size = path.stat().st_size
        store, key = self.plain._store, path.name        # the S3Store carries the prefix
        ranges = [(lo, min(lo + self.get_bytes, size)) for lo in range(0, size, self.get_bytes)]
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if dest else None

        def get(r):
            data = obs.get_range(store, key, start=r[0], end=r[1])
            if fd is not None:
                os.pwrite(fd, memoryview(data), r[0])
            return len(memoryview(data))

        try:
            with ThreadPoolExecutor(self.threads) as pool:
                t = time.perf_counter()
                n = sum(pool.map(get, ranges))
                s = time.perf_counter() - t
        finally:
            if fd is not None:
                os.close(fd)
        if n != size:
            raise RuntimeError(f"plain GETs of {name} gave {n} bytes, not {size}")
        return s

    def mount(self, mnt: Path, cache: Path):
        argv = [*self.lmz, "mount", "--foreground", "--remote", self.eng.url("store"), "--cache-dir", cache,
                "--poll", "0", mnt]
        return mounted(argv, [*self.lmz, "umount", mnt], mnt, self.work / "mount.log")

    def measure_read(self, name: str, which: str, check: bool = False) -> dict:
        from lmzfs.testing.netns import lo_bytes, port_bytes
        size = self.files[name].stat().st_size
        if which == "plain":
            drop_page_cache()
            w, lo = port_bytes(), lo_bytes()
            c, e = cpu_seconds(os.getpid(), children=False), cpu_seconds(self.eng.proc.pid)
            s = self.plain_stream(name)
            return {"seconds": s, "wire_bytes": port_bytes() - w, "lo_bytes": lo_bytes() - lo,
                    "client_cpu_s": cpu_seconds(os.getpid(), children=False) - c,
                    "engine_cpu_s": cpu_seconds(self.eng.proc.pid) - e, "loadavg": os.getloadavg()[0]}
        cache = self.work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        try:
            with self.mount(self.work / "mnt", cache) as m:
                path = m.path / name / self.files[name].name
                drop_page_cache()
                w, lo = port_bytes(), lo_bytes()
                c, e = cpu_seconds(m.proc.pid), cpu_seconds(self.eng.proc.pid)
                n, s = read_sequential(path)
                wire, lo = port_bytes() - w, lo_bytes() - lo
                c, e = cpu_seconds(m.proc.pid) - c, cpu_seconds(self.eng.proc.pid) - e
                st = json.loads((m.path / ".lmzfs" / "stats.json").read_text())["remote"]["fetch"]
                row = {"seconds": s, "wire_bytes": wire, "lo_bytes": lo, "mount_cpu_s": c, "engine_cpu_s": e,
                       "loadavg": os.getloadavg()[0], "fetched_bytes": st["bytes_fetched"],
                       "requests": st["requests"], "mount_s": m.ready_s}
                if n != size:
                    raise RuntimeError(f"read {n} bytes of {name} through the mount, not {size}")
                if check:
                    row["sha256_ok"] = _sha(path) == _sha(self.files[name])
                return row
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    def measure_load(self, name: str, which: str) -> dict:
        if which == "plain":
            dest = self.work / "download" / self.files[name].name
            dest.parent.mkdir(exist_ok=True)
            try:
                drop_page_cache()
                t = time.perf_counter()
                fetch_s = self.plain_stream(name, dest)
                n = load_file(dest)
                total = time.perf_counter() - t
            finally:
                dest.unlink(missing_ok=True)
            return {"seconds": total, "fetch_s": fetch_s, "load_s": total - fetch_s, "tensor_bytes": n}
        cache = self.work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        try:
            with self.mount(self.work / "mnt", cache) as m:
                path = m.path / name / self.files[name].name
                drop_page_cache()
                t = time.perf_counter()
                n = load_file(path)
                total = time.perf_counter() - t
                return {"seconds": total, "tensor_bytes": n}
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    # -- the run ----------------------------------------------------------------------------------
    def measure(self) -> None:
        from lmzfs.testing.netns import burst_for, shape_lo
        if self.load_rate:
            import torch  # noqa: F401 -- imported before any timing
        for rate in self.rates:
            shaped = None if rate == "none" else rate
            shape_lo(shaped, port=self.eng.ports[3])
            q = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout.strip()
            entry: dict = {"qdisc": q, "burst": burst_for(shaped) if shaped else None, "reads": {}, "loads": {}}
            self.out["rates"][rate] = entry
            for name in self.files:
                rows = []
                for i in range(self.runs):
                    log(f"link: {rate}: {name} read, run {i + 1}/{self.runs}")
                    order = ("plain", "mount") if i % 2 == 0 else ("mount", "plain")
                    row = {}
                    for which in order:
                        try:
                            row[which] = self.measure_read(name, which, check=(i == 0 and rate == self.rates[-1]
                                                                              and which == "mount"))
                        except Exception as exc:
                            row[which] = {"error": describe(exc)}
                    rows.append(row)
                entry["reads"][name] = rows
                if rate == self.load_rate:
                    rows = []
                    for i in range(self.runs):
                        log(f"link: {rate}: {name} load, run {i + 1}/{self.runs}")
                        order = ("plain", "mount") if i % 2 == 0 else ("mount", "plain")
                        row = {}
                        for which in order:
                            try:
                                row[which] = self.measure_load(name, which)
                            except Exception as exc:
                                row[which] = {"error": describe(exc)}
                        rows.append(row)
                    entry["loads"][name] = rows
        shape_lo(None)


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def inner_main(args) -> int:
    from lmzfs.testing.netns import exit_with_parent
    from lmzfs.testing.seaweed import S3Engine

    def leave(signum, _frame):          # the exit paths below stop the engine and unmount
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, leave)
    exit_with_parent()
    files = dict(args.file)
    lmz = [args.lmz] if args.lmz else [sys.executable, "-m", "lmzfs"]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="lmz-bench-link-", dir=args.tmpdir))
    b = Inner(files, lmz, work, args.runs, args.rates.split(","), args.load_rate or None)
    try:
        with S3Engine(work / "engine") as eng:
            with env_set(**eng.env()):
                b.setup(eng)
                b.out["engine"] = "SeaweedFS `weed mini` inside the namespace, data on this machine's disk"
                try:
                    b.measure()
                except Exception as exc:
                    b.out["error"] = describe(exc)
    except Exception as exc:
        b.out["error"] = describe(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps(b.out, indent=1, default=str) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", action="append", required=True, type=lambda s: (s.split("=", 1)[0], Path(s.split("=", 1)[1])),
                    metavar="NAME=PATH")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--lmz", default=None, help="our CLI (default: this Python's -m lmzfs)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rates", default=",".join(RATES), help="tc rates, `none` for unshaped (default: %(default)s)")
    ap.add_argument("--load-rate", default=LOAD_RATE, help="the rate the loaders run at ('' for none)")
    ap.add_argument("--tmpdir", type=Path, default=None)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        return inner_main(args)
    from lmzfs.testing.netns import ShapedLink

    def leave(signum, _frame):          # SIGTERM too unwinds: the namespace goes, whatever happens
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, leave)
    work = Path(tempfile.mkdtemp(prefix="lmz-bench-link-", dir=args.tmpdir))
    try:
        with ShapedLink() as link:
            log(f"link: namespace {link.name}")
            argv = [sys.executable, str(Path(__file__).resolve()), "--inner", "--workdir", str(work),
                    *(sys.argv[1:] if argv is None else argv)]
            # subprocess.run kills the child on any exception; the link's exit stops what is left in it
            proc = subprocess.run(link.argv(argv), stdin=subprocess.DEVNULL, timeout=3 * 3600)
            if proc.returncode != 0:
                raise SystemExit(f"the run inside the namespace exited {proc.returncode}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
