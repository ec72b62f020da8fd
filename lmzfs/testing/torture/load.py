"""load: N reader threads read 3 models through a real mount for a bounded time, every read
checked against the original bytes, while a loop runs add, rm, gc, rewrite compact and rewrite
recode beside them; reads done, errors and the daemon's peak memory (VmHWM) reported."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from lmzfs.testing.torture import Case, Outcome
from lmzfs.testing.torture.common import fresh_copy, lmz, read_all, unmount_quietly

MODELS = ("minilm/model.safetensors", "quire/model.safetensors", "run/step-0/model.safetensors")


def _vmhwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def load_case(prep, scratch: Path, readers: int, seconds: float, seed: int) -> Outcome:
    from lmzfs.testing.mount import mounted
    store = fresh_copy(prep.store, scratch / "store")
    mnt = scratch / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    originals = {k: (prep.sources[k.rsplit("/", 1)[0]] / k.rsplit("/", 1)[1]).read_bytes() for k in MODELS}
    out = Outcome(f"load {readers} readers {seconds:.0f}s")
    stats = {"reads": 0, "bytes": 0, "errors": 0, "wrong": 0, "churn": 0, "churn_failed": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def reader(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while not stop.is_set():
            key = rng.choice(MODELS)
            data = originals[key]
            try:
                with open(mnt / key, "rb") as f:
                    for _ in range(20):
                        at = rng.randrange(len(data))
                        n = rng.choice([1, 4096, 65536, 1 << 20])
                        got = os.pread(f.fileno(), n, at)
                        with lock:
                            stats["reads"] += 1
                            stats["bytes"] += len(got)
                            if got != data[at:at + n]:
                                stats["wrong"] += 1
                        if stop.is_set():
                            break
            except OSError as exc:
                with lock:
                    stats["errors"] += 1
                    if len(errors) < 5:
                        errors.append(f"{key}: {exc}")

    churn_cmds = [["add", str(prep.sources["newcomer"]), "--name", "newcomer"], ["rm", "newcomer"], ["gc"],
                  ["rewrite", "compact", "--all"], ["rewrite", "recode"],
                  ["add", str(prep.sources["doomed"]), "--name", "doomed"], ["rm", "doomed"], ["gc"]]
    peak = 0
    with mounted(mnt, store, timeout=30) as fs:
        threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
        for t in threads:
            t.start()
        end = time.monotonic() + seconds
        k = 0
        while time.monotonic() < end:
            argv = churn_cmds[k % len(churn_cmds)]
            k += 1
            try:
                r = subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), *argv],
                                   capture_output=True, text=True, timeout=120)
                stats["churn"] += 1
                if r.returncode != 0:
                    stats["churn_failed"] += 1
                    out.problems.append(f"lmz {' '.join(argv[:2])} beside the readers: rc={r.returncode} {r.stderr.strip()[-200:]}")
                if "Traceback (most recent call last)" in r.stderr:
                    out.traceback = out.traceback or r.stderr[-3000:]
            except subprocess.TimeoutExpired:
                out.hang = True
                out.problems.append(f"lmz {' '.join(argv)} ran past 120 s beside the readers")
                break
            peak = max(peak, _vmhwm_kib(fs.process.pid))
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if any(t.is_alive() for t in threads):
            out.hang = True
            out.problems.append("a reader did not stop within 60 s")
        peak = max(peak, _vmhwm_kib(fs.process.pid))
        if "Traceback (most recent call last)" in fs.log():
            out.traceback = out.traceback or fs.log()[-3000:]
    unmount_quietly(mnt)
    out.items = stats["reads"]
    out.wrong_bytes = stats["wrong"]
    if stats["errors"]:
        out.problems.append(f"{stats['errors']} reads failed: {errors}")
    expected = {k: v for k, v in prep.expected.items()}
    rb = read_all(store, expected)
    out.wrong_bytes += len(rb.wrong)
    out.models_lost = len({k.rsplit("/", 1)[0] for k in expected if k not in rb.right})
    v = lmz(store, "verify")
    if v.rc != 0:
        out.problems.append(f"verify after the load: {v.stderr.strip()[-200:]}")
    out.info.update({"reads": stats["reads"], "read_errors": stats["errors"], "churn_commands": stats["churn"],
                     "MiB_read": stats["bytes"] >> 20, "peak_daemon_rss_mib": peak // 1024, "readers": readers})
    return out


def cases(prep, scratch: Path, rng: random.Random, sample: bool, seconds: float = 60) -> Iterator[Case]:
    readers, secs = (8, 4) if sample else (32, seconds)
    yield Case(f"load {readers}x{secs:.0f}s", lambda: load_case(prep, scratch, readers, secs, rng.randrange(1 << 30)),
               secs + 240)
