#!/usr/bin/env python3
"""Issue 45: a remote store on a real S3 engine (SeaweedFS `weed mini` on loopback, lmzfs.testing.seaweed).

    .venv/bin/python bench/remote_table.py --astra FILE --json OUT.json [--lmz LMZFS_CLI] [--runs 3]

Runs in the project's venv (it imports lmzfs, obstore and boto3); bench/run.py runs it as its
`remote` section. One engine for the whole run, in a directory of its own, stopped at the end
whatever happens; every mount is unmounted. Measures:

- push: `lmz push` of a store holding astra into an empty prefix (push() in this process, of the
  lmzfs under test), --runs times, each to a prefix of its own: MB/s of the original file and of
  the bytes uploaded; then a second push of the unchanged store (what moves: nothing), and a push
  after `lmz add` of a fine-tune of astra (a 1 MiB stretch of its weights changed), through a
  counting proxy: every byte sent to the engine, beside the stored bytes of the new model;
- read: astra front to back in 1 MiB reads, the page cache dropped before each (`sync; echo 3 >
  /proc/sys/vm/drop_caches`, as root), each on a fresh mount: the local store's mount; the remote
  mount with an empty cache dir (cold); the remote mount again on the cache the cold read filled
  (warm); the local store's mount again; ratios to the mean of the two local reads within each
  run (one local read alone moves the ratios by its own noise). The bytes the cold read fetched from the
  engine (MNT/.lmzfs/stats.json, remote.fetch.bytes_fetched) beside the file's stored bytes;
- two "hosts": two remote mounts, separate cache dirs and processes, serve every file of the
  prefix (astra and its fine-tune) with the originals' SHA-256;
- client library: ranged GETs of the largest pack object, of the mount fetcher's request size
  (MAX_GET_BYTES) and as many at once as its fetch threads, obstore (through lmzfs's ObjectStore, and
  called directly) against boto3's client in the same threads, rotating the order, --runs times:
  MB/s, and CPU seconds of this process per GB fetched (the engine's own CPU not included);
- polling: a mount at --poll 1s behind a counting TCP proxy, idle for POLL_WINDOW_S: requests and
  bytes per poll, hence per host per hour at the default 30 s, and for fleets of 10, 100, 1000;
- cache cap: a mount with --cache-size a third of astra's stored bytes reading astra (3x the cap):
  the largest the cache dir's object files reached (du: holes not counted; sampled), against the cap.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, describe, du_bytes, log, mounted, read_sequential, run, sha256_file  # noqa: E402

POLL_WINDOW_S = 60.0
POLL_S = 1.0
FLEET_POLL_S = 30.0                  # the default remote_poll
FLEETS = (10, 100, 1000)
from lmzfs.store.remote.fetch import FETCH_THREADS as GET_THREADS, MAX_GET_BYTES as GET_BYTES  # noqa: E402 -- the mount's
FINETUNE_BYTES = 1 << 20             # the stretch of astra's weights the fine-tune changes
GOALS = {"cold": 0.8, "warm": 0.95, "fetched": 1.03, "cache_cap": 1.05}


# ----------------------------------------------------------------------------- a counting proxy

_REQUEST = re.compile(rb"(GET|HEAD|PUT|POST|DELETE) (/\S*) HTTP/1\.[01]\r\n")


class CountingProxy:
    """A TCP proxy in front of the engine that counts the HTTP requests passing through it (by
    their request lines) and the bytes each way. Signed S3 requests pass unchanged: the client
    signs for the proxy's address, which is the Host header the engine then sees."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.reset()
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            self.requests: list[tuple[str, str]] = []
            self.bytes_up = 0
            self.bytes_down = 0

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        tail = b""
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                with self.lock:
                    if up:
                        self.bytes_up += len(data)
                        seen = tail + data
                        for m in _REQUEST.finditer(seen):
                            if m.end() > len(tail):
                                self.requests.append((m[1].decode(), m[2].decode(errors="replace")))
                        tail = seen[-300:]
                    else:
                        self.bytes_down += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


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


# ----------------------------------------------------------------------------- helpers


def _cpu() -> float:
    import resource
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def drop_page_cache() -> bool:
    """sync, then drop the page cache (root only); False where it cannot be done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def stats_of(mnt: Path) -> dict:
    return json.loads((mnt / ".lmzfs" / "stats.json").read_text())


def model_files(mnt: Path) -> dict[str, Path]:
    out = {}
    for d, dirs, names in os.walk(mnt):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for n in names:
            p = Path(d) / n
            out[str(p.relative_to(mnt))] = p
    return out


def finetune(src: Path, dest: Path) -> Path:
    """astra with FINETUNE_BYTES in the middle of its weights XORed with 1 (the lowest mantissa bit
    of every BF16 there): a fine-tune that touched one stretch of the file."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / src.name
    shutil.copyfile(src, out)
    size = out.stat().st_size
    at = (size // 2) & ~0xFFFF
    with open(out, "r+b") as f:
        f.seek(at)
        buf = bytearray(f.read(FINETUNE_BYTES))
        for i in range(0, len(buf), 2):
            buf[i] ^= 1
        f.seek(at)
        f.write(buf)
    return out


class Bench:
    def __init__(self, astra: Path, lmz: list[str], work: Path, runs: int):
        self.astra, self.lmz, self.work, self.runs = astra, lmz, work, runs
        self.out: dict = {"file": {"name": astra.name, "bytes": astra.stat().st_size}, "runs": runs}
        self.store = work / "store"
        self.eng = None

    # -- the engine and the store ---------------------------------------------------------------
    def objects(self, prefix: str, endpoint: str | None = None):
        from lmzfs.store.remote.objects import ObjectStore, RemoteURL
        return ObjectStore(RemoteURL.parse(self.eng.url(prefix)), endpoint=endpoint)

    def add(self, store: Path, src_dir: Path, name: str) -> float:
        t = time.monotonic()
        run([*self.lmz, "--store", store, "add", src_dir, "--name", name], timeout=3600)
        return time.monotonic() - t

    def push(self, prefix: str, endpoint: str | None = None):
        from lmzfs.store.layout import StorePaths
        from lmzfs.store.remote.push import push
        return push(StorePaths(self.store), self.objects(prefix, endpoint))

    # -- the measurements -----------------------------------------------------------------------
    def measure_push(self) -> None:
        src = self.work / "src-astra"
        src.mkdir()
        try:
            os.link(self.astra, src / self.astra.name)
        except OSError:
            shutil.copyfile(self.astra, src / self.astra.name)
        self.out["add_s"] = self.add(self.store, src, "astra")
        rows = []
        for i in range(self.runs):
            log(f"remote: push {i + 1}/{self.runs}")
            r = self.push(f"push{i}")
            rows.append({"seconds": r.seconds, "bytes_uploaded": r.bytes_uploaded, "objects": r.objects_uploaded,
                         "chunks": r.chunks_uploaded, "stored_bytes": r.stored_bytes})
        self.out["push"] = rows
        self.out["stored_bytes"] = rows[0]["stored_bytes"]
        self.prefix = "push0"
        r = self.push(self.prefix)
        self.out["push_again"] = {"seconds": r.seconds, "bytes_uploaded": r.bytes_uploaded,
                                  "published": r.published}

    def measure_incremental(self) -> None:
        log("remote: a fine-tune of astra added and pushed")
        tuned = finetune(self.astra, self.work / "src-tuned")
        self.out["finetune_add_s"] = self.add(self.store, tuned.parent, "astra-tuned")
        listing = json.loads(run([*self.lmz, "--store", self.store, "ls", "--json"], timeout=600))
        self.out["listing"] = listing
        proxy = CountingProxy(("127.0.0.1", self.eng.ports[3]))
        try:
            r = self.push(self.prefix, endpoint=proxy.endpoint)
            methods: dict[str, int] = {}
            for m, _ in proxy.requests:
                methods[m] = methods.get(m, 0) + 1
            self.out["push_finetune"] = {"seconds": r.seconds, "bytes_uploaded": r.bytes_uploaded,
                                         "chunks": r.chunks_uploaded, "objects": r.objects_uploaded,
                                         "sent_to_engine": proxy.bytes_up, "received": proxy.bytes_down,
                                         "requests": methods, "stored_bytes_total": r.stored_bytes}
        finally:
            proxy.close()
        self.out["finetune"] = {"bytes": tuned.stat().st_size, "changed_bytes": FINETUNE_BYTES}
        self.originals = {f"astra/{self.astra.name}": sha256_file(self.astra),
                          f"astra-tuned/{tuned.name}": sha256_file(tuned)}

    def mount_remote(self, mnt: Path, cache: Path, *extra: str):
        argv = [*self.lmz, "mount", "--foreground", "--remote", self.eng.url(self.prefix), "--cache-dir", cache,
                *extra, mnt]
        return mounted(argv, [*self.lmz, "umount", mnt], mnt, self.work / "mount.log")

    def mount_local(self, mnt: Path):
        return mounted([*self.lmz, "--store", self.store, "mount", "--foreground", mnt],
                       [*self.lmz, "umount", mnt], mnt, self.work / "mount.log")

    def timed_read(self, path: Path, mount_pid: int) -> dict:
        """The file read front to back on a dropped page cache; the CPU seconds the mount's process
        and the engine spent meanwhile (on a host whose CPUs they share, what bounds the read)."""
        dropped = drop_page_cache()
        c, e = cpu_seconds(mount_pid), cpu_seconds(self.eng.proc.pid)
        n, s = read_sequential(path)
        c, e = cpu_seconds(mount_pid) - c, cpu_seconds(self.eng.proc.pid) - e
        if n != self.out["file"]["bytes"]:
            raise RuntimeError(f"read {n} bytes of {path}, not {self.out['file']['bytes']}")
        return {"seconds": s, "dropped": dropped, "mount_cpu_s": round(c, 3), "engine_cpu_s": round(e, 3)}

    def measure_reads(self) -> None:
        rows = []
        name = f"astra/{self.astra.name}"
        for i in range(self.runs):
            log(f"remote: reads, run {i + 1}/{self.runs}")
            row: dict = {}
            cache = self.work / f"cache-read{i}"
            with self.mount_local(self.work / "mnt-local") as m:
                row["local"] = self.timed_read(m.path / name, m.proc.pid)
            with self.mount_remote(self.work / "mnt-remote", cache, "--poll", "0") as m:
                row["cold"] = self.timed_read(m.path / name, m.proc.pid)
                st = stats_of(m.path)["remote"]
                row["cold_fetch"] = st["fetch"]
                row["cold_disk_cache"] = st["disk_cache"]
                if i == 0:
                    row["sha256_ok"] = sha256_file(m.path / name) == sha256_file(self.astra)
            with self.mount_remote(self.work / "mnt-remote", cache, "--poll", "0") as m:
                row["warm"] = self.timed_read(m.path / name, m.proc.pid)
                row["warm_fetch"] = stats_of(m.path)["remote"]["fetch"]
            with self.mount_local(self.work / "mnt-local") as m:       # again: the ratios use the mean
                row["local_after"] = self.timed_read(m.path / name, m.proc.pid)
            shutil.rmtree(cache, ignore_errors=True)
            rows.append(row)
        self.out["reads"] = rows
        self.out["cpus"] = len(os.sched_getaffinity(0))

    def measure_two_hosts(self) -> None:
        log("remote: two mounts, separate caches and processes")
        got: dict = {}
        with self.mount_remote(self.work / "mnt-a", self.work / "cache-a", "--poll", "0") as a, \
                self.mount_remote(self.work / "mnt-b", self.work / "cache-b", "--poll", "0") as b:
            pids = {stats_of(a.path).get("pid"), stats_of(b.path).get("pid")}
            for host, m in (("a", a), ("b", b)):
                got[host] = {}
                for rel, p in sorted(model_files(m.path).items()):
                    try:
                        got[host][rel] = sha256_file(p)
                    except OSError as exc:          # reported, not hidden: the run goes on
                        got[host][rel] = f"error: {exc.strerror or exc}"
        same = got["a"] == got["b"] == self.originals
        self.out["two_hosts"] = {"files": len(self.originals), "identical": same, "separate_processes": len(pids) == 2,
                                 "sha256": got, "originals": self.originals}
        for d in ("cache-a", "cache-b"):
            shutil.rmtree(self.work / d, ignore_errors=True)

    def measure_clients(self) -> None:
        import boto3
        from botocore.config import Config
        obj = self.objects(self.prefix)
        packs = [o for o in obj.list("packs/") if o.key.endswith(".lmzp")]
        big = max(packs, key=lambda o: o.size)
        key = f"{self.prefix}/{big.key}"
        ranges = [(lo, min(lo + GET_BYTES, big.size)) for lo in range(0, big.size, GET_BYTES)]
        env = self.eng.env()
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                              config=Config(max_pool_connections=GET_THREADS * 2, retries={"max_attempts": 3}))
        bucket = self.eng.bucket

        import obstore as obs
        raw_store = obj._store          # the same obstore S3Store lmzfs's ObjectStore wraps
        raw_key = big.key

        def with_obstore(r):
            return len(obj.get_range(big.key, r[0], r[1]))

        def with_obstore_raw(r):
            return len(obs.get_range(raw_store, raw_key, start=r[0], end=r[1]))

        def with_boto3(r):
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={r[0]}-{r[1] - 1}")["Body"]
            return len(body.read())

        def timed(fn) -> tuple[float, float]:
            """(wall seconds, CPU seconds of this process, every thread, user + system)"""
            with ThreadPoolExecutor(GET_THREADS) as pool:
                c = _cpu()
                t = time.perf_counter()
                n = sum(pool.map(fn, ranges))
                s = time.perf_counter() - t
                c = _cpu() - c
            if n != big.size:
                raise RuntimeError(f"got {n} bytes of {big.size}")
            return s, c

        clients = [("obstore", with_obstore), ("obstore_raw", with_obstore_raw), ("boto3", with_boto3)]
        for _, fn in clients:
            timed(fn)                   # connections and the engine's own caches, once
        rows: dict[str, list] = {label: [] for label, _ in clients}
        cpu: dict[str, list] = {label: [] for label, _ in clients}
        for i in range(self.runs):
            order = clients[i % len(clients):] + clients[:i % len(clients)]
            for label, fn in order:
                s, c = timed(fn)
                rows[label].append(s)
                cpu[label].append(c)
        self.out["clients"] = {"object_bytes": big.size, "get_bytes": GET_BYTES, "threads": GET_THREADS,
                               "requests": len(ranges), "seconds": rows, "cpu_seconds": cpu,
                               "versions": {"obstore": obs.__version__, "boto3": boto3.__version__}}

    def measure_polling(self) -> None:
        log(f"remote: an idle mount polling every {POLL_S:g} s for {POLL_WINDOW_S:.0f} s")
        proxy = CountingProxy(("127.0.0.1", self.eng.ports[3]))
        try:
            with env_set(AWS_ENDPOINT_URL=proxy.endpoint), \
                    self.mount_remote(self.work / "mnt-poll", self.work / "cache-poll", "--poll", f"{POLL_S:g}s") as m:
                time.sleep(POLL_S * 1.5)
                proxy.reset()
                t = time.monotonic()
                time.sleep(POLL_WINDOW_S)
                with proxy.lock:
                    reqs, up, down = list(proxy.requests), proxy.bytes_up, proxy.bytes_down
                window = time.monotonic() - t
                last_poll = stats_of(m.path)["remote"].get("last_poll")
        finally:
            proxy.close()
        shutil.rmtree(self.work / "cache-poll", ignore_errors=True)
        polls = window / POLL_S
        keys: dict[str, int] = {}
        for method, path in reqs:
            k = f"{method} {path.split('?')[0].rsplit('/', 1)[-1]}"
            keys[k] = keys.get(k, 0) + 1
        per_poll = len(reqs) / polls
        per_hour = per_poll * 3600 / FLEET_POLL_S
        self.out["polling"] = {"poll_s": POLL_S, "window_s": window, "requests": len(reqs), "by_key": keys,
                               "bytes_up": up, "bytes_down": down, "requests_per_poll": per_poll,
                               "bytes_per_poll": (up + down) / polls, "last_poll": last_poll,
                               "fleet_poll_s": FLEET_POLL_S, "per_host_per_hour": per_hour,
                               "fleet": {str(n): {"requests_per_hour": n * per_hour,
                                                  "requests_per_s": n * per_hour / 3600,
                                                  "bytes_per_hour": n * (up + down) / polls * 3600 / FLEET_POLL_S}
                                         for n in FLEETS}}

    def measure_cache_cap(self) -> None:
        cap = max(8 << 20, (self.out["stored_bytes"] // 3) & ~((1 << 20) - 1))
        log(f"remote: a {cap >> 20} MiB disk cache reading astra")
        cache = self.work / "cache-cap"
        peak = {"du": 0, "accounted": 0}
        stop = threading.Event()
        with self.mount_remote(self.work / "mnt-cap", cache, "--poll", "0", "--cache-size", str(cap)) as m:
            def sample():
                while not stop.wait(0.1):
                    with contextlib.suppress(OSError):
                        peak["du"] = max(peak["du"], du_bytes(cache / "objects"))
            t = threading.Thread(target=sample, daemon=True)
            t.start()
            try:
                n, s = read_sequential(m.path / f"astra/{self.astra.name}")
            finally:
                stop.set()
                t.join()
            st = stats_of(m.path)["remote"]
        peak["du"] = max(peak["du"], du_bytes(cache / "objects"))
        shutil.rmtree(cache, ignore_errors=True)
        self.out["cache_cap"] = {"cap_bytes": cap, "read_bytes": n, "fetched_bytes": st["fetch"]["bytes_fetched"],
                                 "peak_du_bytes": peak["du"], "end_accounted_bytes": st["disk_cache"]["bytes"],
                                 "evicted": st["disk_cache"]["evicted"], "seconds": s}


def measure(astra: Path, lmz: list[str], work: Path, runs: int) -> dict:
    from lmzfs.testing.seaweed import S3Engine
    b = Bench(astra, lmz, work, runs)
    steps = [b.measure_push, b.measure_reads, b.measure_clients, b.measure_polling, b.measure_cache_cap,
             b.measure_incremental, b.measure_two_hosts]
    with S3Engine(work / "engine") as eng:
        b.eng = eng
        b.out["engine"] = f"SeaweedFS `weed mini` ({weed_version()}) on 127.0.0.1, data on the same disk"
        with env_set(**eng.env()):
            for step in steps:
                try:
                    step()
                except Exception as exc:
                    log(f"remote: {step.__name__} failed: {describe(exc)}")
                    b.out.setdefault("errors", {})[step.__name__.removeprefix("measure_")] = describe(exc)
                    if step is b.measure_push:
                        break
    return b.out


def weed_version() -> str:
    from lmzfs.testing.seaweed import weed_binary
    with contextlib.suppress(Exception):
        text = subprocess.run([weed_binary(), "version"], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"(\d+\.\d+)", text)
        if m:
            return m.group(1)
    return "version unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--astra", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--lmz", default=None, help="our CLI (default: this Python's -m lmzfs)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tmpdir", type=Path, default=None)
    ap.add_argument("--poll-window", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poll_window:
        globals()["POLL_WINDOW_S"] = args.poll_window
    lmz = [args.lmz] if args.lmz else [sys.executable, "-m", "lmzfs"]
    work = Path(tempfile_dir(args.tmpdir))
    try:
        out = measure(args.astra, lmz, work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


def tempfile_dir(base: Path | None) -> str:
    import tempfile
    return tempfile.mkdtemp(prefix="lmz-bench-remote-", dir=base)


if __name__ == "__main__":
    raise SystemExit(main())
