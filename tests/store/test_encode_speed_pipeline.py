"""`lmz add`'s pipeline under stress: killed with -9 while its workers encode chunks in parallel,
the store is as it was; adding a 1 GiB file keeps the process's memory bounded (a window of
chunks, never the file)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StorePaths
from lmzfs.admin.verify import verify_store
from lmzfs.testing.killpoints import kill_at_marker
from lmzfs.testing.synthetic import small_model

# Prints HERE once two workers are encoding weight chunks at the same moment (a barrier holds the
# first two until both have started), then lets the add go on until the kill lands: each encode
# takes a tenth of a second longer, so that the workers are still at it after the kill's delay;
# the commit never comes (the kill point session-sealed holds it).
PARALLEL_ADD = """
import sys, threading, time
from pathlib import Path
import lmzfs.store.add as add
import lmzfs.store.write.encodefile as encodefile
from lmzfs.store.layout import StorePaths
real_encode = encodefile.encode_alone
both = threading.Barrier(2)
said = threading.Event()
def encode(*a, **k):
    if len(a[1]) >= 1 << 20 and not said.is_set():
        try:
            if both.wait(timeout=30) == 0:
                print("HERE", flush=True)
                said.set()
        except threading.BrokenBarrierError:
            pass
    got = real_encode(*a, **k)
    time.sleep(0.1)
    return got
encodefile.encode_alone = encode
add.add_model(StorePaths(Path(sys.argv[1])), Path(sys.argv[2]), "victim", workers=2)
print("DONE", flush=True)
"""


def _models(store: StorePaths) -> list[str]:
    cat = Catalog(store.catalog, readonly=True)
    try:
        return [m.name for m in cat.models()]
    finally:
        cat.close()


def _pack_bytes(store: StorePaths) -> int:
    return sum(p.stat().st_size for p in store.packs.glob("pack-*.lmzp"))


def _read(store_dir: Path, name: str) -> bytes:
    archive = Archive(store_dir)
    try:
        (entry,) = [e for e in archive.files() if f"{e.model}/{e.path}" == name]
        with archive.open(entry) as r:
            return r.pread(0, entry.size)
    finally:
        archive.close()


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_kill_9_while_workers_encode_in_parallel_leaves_the_store_as_it_was(tmp_path, delay):
    store = StorePaths(tmp_path / "store")
    keep = small_model(tmp_path / "keep", seed=21, mib=2)
    add_model(store, keep, "keep")
    before = _pack_bytes(store)
    victim = small_model(tmp_path / "victim", seed=22, mib=12)
    kill_at_marker([sys.executable, "-c", PARALLEL_ADD, str(store.root), str(victim)], "HERE", delay=delay,
                   env={**os.environ, "LMZ_KILL_AT": "session-sealed"})
    assert _models(store) == ["keep"]
    assert verify_store(store).ok
    assert _read(store.root, "keep/model.safetensors") == (keep / "model.safetensors").read_bytes()
    # what the killed add appended is dead bytes at the packs' end, which gc drops entirely
    collect_garbage(store)
    assert _pack_bytes(store) == before
    add_model(store, victim, "victim")
    assert _read(store.root, "victim/model.safetensors") == (victim / "model.safetensors").read_bytes()


# Runs `lmz add` in this process and prints its peak resident memory (VmHWM, KiB). Not ru_maxrss:
# Linux carries it across execve, so the child would report the spawning pytest process's own RSS
# (over 1 GiB late in a full run).
MEASURED_ADD = """
import json, re, sys
from lmzfs.cli import main
code = main(["--store", sys.argv[1], "add", sys.argv[2], "--name", "big"])
hwm = int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"code": code, "vmhwm_kib": hwm}))
"""

GIB = 1 << 30
MEMORY_BOUND_MIB = 600


def _peak_of_add(tmp_path: Path, source: Path) -> int:
    run = subprocess.run([sys.executable, "-c", MEASURED_ADD, str(tmp_path / "store"), str(source)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["code"] == 0
    return got["vmhwm_kib"] >> 10


def test_adding_a_1_gib_file_keeps_peak_memory_under_600_mib(tmp_path):
    # Sparse, so cheap to make: zeros with a distinct counter in every MiB, so that no chunk is
    # reused and every one goes through the read, hash and encode window.
    src = tmp_path / "src"
    src.mkdir()
    blob = src / "blob.bin"
    with open(blob, "wb") as f:
        f.truncate(GIB)
        for i in range(GIB >> 20):
            f.seek(i << 20)
            f.write(i.to_bytes(8, "little"))
    try:
        assert _peak_of_add(tmp_path, src) < MEMORY_BOUND_MIB
    finally:
        blob.unlink()


@pytest.mark.skipif(not os.environ.get("LMZ_BIG_ADD"), reason="set LMZ_BIG_ADD=1: a 1 GiB BF16 add (minutes)")
def test_adding_a_1_gib_bf16_safetensors_file_keeps_peak_memory_under_600_mib(tmp_path):
    # Real weights, all through floatsplit: the corpus's BF16 tensors' bytes, repeated with a
    # distinct first element in every MiB so that no chunk is reused.
    from lmzfs.testing.corpus import CorpusUnavailable, fetch
    try:
        astra = fetch("astra")
    except CorpusUnavailable as exc:
        pytest.skip(f"corpus file astra cannot be fetched: {exc}")
    real = np.fromfile(astra, dtype=np.uint8, count=64 << 20, offset=astra.stat().st_size - (64 << 20))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [GIB // 2], "data_offsets": [0, GIB]}}).encode()
    header += b" " * (-len(header) % 8)
    src = tmp_path / "src"
    src.mkdir()
    path = src / "big.safetensors"
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        for i in range(GIB // len(real)):
            block = real.copy()
            block[::1 << 20] ^= np.uint8(i + 1)
            f.write(block.tobytes())
    try:
        peak = _peak_of_add(tmp_path, src)
        print(f"peak resident memory of the add: {peak} MiB")
        assert peak < MEMORY_BOUND_MIB
    finally:
        path.unlink()
