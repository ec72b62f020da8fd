"""A loader's scattered touches through a real mount (the first page of each tensor of an mmap'd
file, each a lone read of the kernel's read-around that the daemon decodes on two threads),
then every page: exact bytes, each touched segment decoded on its own."""
from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
import pytest

from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted

pytestmark = pytest.mark.mount

TENSORS = 12
TENSOR_BYTES = 3 << 20          # BF16 tensors of 3 MiB, back to back


def bf16_tensors(d: Path) -> Path:
    rng = np.random.default_rng(21)
    d.mkdir(parents=True, exist_ok=True)
    meta, blobs, at = {}, [], 0
    for i in range(TENSORS):
        w = rng.normal(0, 0.02, TENSOR_BYTES // 2).astype(np.float32)
        blob = (w.view(np.uint32) >> 16).astype("<u2").tobytes()
        meta[f"t{i}"] = {"dtype": "BF16", "shape": [TENSOR_BYTES // 2], "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    header = json.dumps(meta)
    header += " " * (-len(header) % 8)
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"".join(blobs))
    return d


def test_scattered_touches_then_every_page_through_an_mmap_read_exact_bytes(tmp_path):
    src = bf16_tensors(tmp_path / "src")
    plain = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", segments=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root, "--workers", "2") as fs:
        with open(fs.mountpoint / "m" / "model.safetensors", "rb") as f, \
                mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            head = 8 + int.from_bytes(m[:8], "little")
            starts = [head + i * TENSOR_BYTES + 4096 * (i % 3) for i in range(0, TENSORS, 2)]
            for at in starts:                       # a page of every other tensor, far apart
                assert m[at:at + 64] == plain[at:at + 64]
            stats = json.loads((fs.mountpoint / ".lmzfs" / "stats.json").read_bytes())["reader"]
            assert stats["segments_decoded"] > 0    # the touches decoded segments, not whole chunks
            assert m[:] == plain                    # then every page
        stats = json.loads((fs.mountpoint / ".lmzfs" / "stats.json").read_bytes())["reader"]
        assert stats["corrupt_chunks"] == 0 and stats["bytes_served"] >= len(plain)
