"""The prepared store every case starts from (a fresh copy each time), built once per run from
real corpus files: leading tensors of minilm (F32) and of the two quire releases (int8), copied
byte for byte into smaller safetensors files so that a case reads the whole store in well under a
second, plus a small synthetic BF16 checkpoint chain (lmzfs.testing.checkpoints)."""
from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lmzfs.testing import corpus
from lmzfs.testing.checkpoints import bf16_checkpoints


def slice_safetensors(src: Path, dest: Path, *, budget: int, skip: int = 0) -> Path:
    """A safetensors file of the tensors of `src` (after the first `skip`) that fit in `budget`
    bytes, each tensor's bytes exactly as in `src`."""
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", None)
        names = sorted(header, key=lambda k: header[k]["data_offsets"][0])[skip:]
        out, blobs, at = {}, [], 0
        for name in names:
            a, b = header[name]["data_offsets"]
            if at + (b - a) > budget and out:
                continue
            f.seek(8 + n + a)
            blobs.append(f.read(b - a))
            out[name] = {"dtype": header[name]["dtype"], "shape": header[name]["shape"], "data_offsets": [at, at + b - a]}
            at += b - a
    if meta:
        out["__metadata__"] = meta
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return dest


@dataclass
class Prepared:
    root: Path                      # the work directory
    store: Path                     # the prepared store
    spool_store: Path               # the same with a writable mount's spool left by a killed daemon
    sources: dict[str, Path]        # model name -> its source dir (stored and spare ones)
    expected: dict[str, str]        # MODEL/PATH -> SHA-256, every file of every stored model
    spare: dict[str, dict[str, str]]   # models not stored yet (the add cases' and mount's), same form
    spooled: tuple[str, str, str]   # (model, path, sha256) of the file the spool holds

    def digests(self, model: str) -> dict[str, str]:
        return digests_of(model, self.sources[model])


def digests_of(model: str, d: Path) -> dict[str, str]:
    return {f"{model}/{p.relative_to(d).as_posix()}": hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _lmz(store: Path, *argv: str) -> None:
    subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), *argv], check=True,
                   stdout=subprocess.DEVNULL, timeout=600)


def prepare(root: Path, *, mib: int = 1) -> Prepared:
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src"
    budget = mib << 20
    minilm, q0, q1 = corpus.fetch("minilm"), corpus.fetch("quire"), corpus.fetch("quire@0.3.1")
    sources = {
        "minilm": slice_safetensors(minilm, src / "minilm" / "model.safetensors", budget=budget).parent,
        "quire": slice_safetensors(q0, src / "quire" / "model.safetensors", budget=budget).parent,
        "quire-next": slice_safetensors(q1, src / "quire-next" / "model.safetensors", budget=budget).parent,
        "doomed": slice_safetensors(minilm, src / "doomed" / "model.safetensors", budget=budget // 2, skip=40).parent,
        "newcomer": slice_safetensors(minilm, src / "newcomer" / "model.safetensors", budget=budget, skip=20).parent,
    }
    (sources["quire"] / "config.json").write_text('{"release": "0.3.0"}')
    chain = bf16_checkpoints(src / "run", 5, seed=48, rows=256, cols=1024)
    for i, d in enumerate(chain[:4]):
        sources[f"run/step-{i}"] = d
    sources["solo"] = chain[4]          # of the run, stored alone: what `rewrite delta` recodes
    store = root / "store"
    _lmz(store, "add", str(sources["minilm"]), "--name", "minilm", "--fast")     # for recode
    _lmz(store, "add", str(sources["quire"]), "--name", "quire")
    _lmz(store, "add", str(sources["quire-next"]), "--name", "quire-next", "--no-delta")   # removed by the rm case
    for i in range(3):      # step-1 recodes step-0, step-2 recodes step-1: a chain; step-3 is spare
        _lmz(store, "add", str(sources[f"run/step-{i}"]), "--name", f"run/step-{i}")
    _lmz(store, "add", str(sources["solo"]), "--name", "solo", "--no-delta")
    _lmz(store, "add", str(sources["doomed"]), "--name", "doomed")
    _lmz(store, "rm", "doomed")                                               # dead bytes for gc, compact
    stored = ["minilm", "quire", "quire-next", "run/step-0", "run/step-1", "run/step-2", "solo"]
    expected = {k: v for m in stored for k, v in digests_of(m, sources[m]).items()}
    spare = {m: digests_of(m, sources[m]) for m in ("newcomer", "run/step-3", "doomed")}
    spool_store, spooled = _spool_store(root, store, sources["newcomer"] / "model.safetensors")
    return Prepared(root, store, spool_store, sources, expected, spare, spooled)


def _spool_store(root: Path, store: Path, data_file: Path) -> tuple[Path, tuple[str, str, str]]:
    """A copy of the store with a file written and fsync'd into a writable mount whose daemon
    was then killed (kill -9): its spool holds the file, uncommitted."""
    import os
    import shutil
    from lmzfs.testing.mount import mounted
    dest = root / "spool-store"
    shutil.copytree(store, dest)
    mnt = root / "spool-mnt"
    mnt.mkdir(exist_ok=True)
    data = data_file.read_bytes()
    with mounted(mnt, dest, "--writable") as fs:
        (mnt / "spooled").mkdir()
        fd = os.open(mnt / "spooled" / "w.bin", os.O_CREAT | os.O_WRONLY)
        os.write(fd, data)
        os.fsync(fd)
        fs.process.kill()       # with the file still open: never committed
        fs.process.wait()
        try:
            os.close(fd)
        except OSError:
            pass
    return dest, ("spooled", "w.bin", hashlib.sha256(data).hexdigest())
