"""Small synthetic models and deliberate damage, for tests of the store, the reader and the mount.

Claims about compression are made on real files (lmzfs.testing.corpus); these are for behaviour.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lmzfs.reader.archive import Archive
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StorePaths


def int8_columns(rows: int, cols: int, seed: int, zeros: float = 0.4) -> bytes:
    """An int8 matrix whose columns have their own spread, with a share of zeros: what the
    entropy codec's column classes are for."""
    rng = np.random.default_rng(seed)
    spread = rng.uniform(0.3, 12, cols)
    v = np.rint(rng.normal(0, 1, (rows, cols)) * spread).clip(-127, 127).astype(np.int8)
    v[rng.random((rows, cols)) < zeros] = 0
    return v.tobytes()


def log_text(lines: int, seed: int = 7) -> bytes:
    """Log-like text: zstd's default level halves it, its slow level does better still (what a
    writable mount's commit leaves for its idle recode, fsmodel/recodetext.py)."""
    import random
    rng = random.Random(seed)
    words = [f"{w}{i}" for i, w in enumerate(["model", "layer", "epoch", "loss", "grad", "step", "shard"] * 40)]
    return b"".join(f"{n:06d} {' '.join(rng.choices(words, k=rng.randint(4, 12)))}\n".encode() for n in range(lines))


def payload_sizes(data: bytes) -> tuple[int, int]:
    """(payload a writable mount's commit codes `data` to as one chunk, payload `lmz add` codes it to)."""
    from lmzfs.codecs import encode_chunk
    return len(encode_chunk(data, thorough=False).payload), len(encode_chunk(data).payload)


def live_payload_bytes(store: Path) -> int:
    """Payload bytes of the chunks something references, as the catalog records them."""
    catalog = Catalog(StorePaths(store).catalog, readonly=True)
    try:
        return catalog.db.execute("SELECT COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()[0]
    finally:
        catalog.close()


def small_model(d: Path, seed: int = 0, mib: int = 3) -> Path:
    """A synthetic safetensors model (weights are random normal FP32) plus a config file."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    n = mib * (1 << 18)
    save_file({"w": rng.standard_normal(n, dtype=np.float32), "b": rng.standard_normal(384, dtype=np.float32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"seed": seed, "hidden": 384}))
    return d


def flip_byte_in_chunk_of(store: StorePaths, model: str, path: str, at: float = 0.5) -> int:
    """Flip one byte in the middle of the payload of a chunk of MODEL/PATH; returns a plain offset
    whose read must fail: the chunk's, or for a chunk that decodes in segments (whose other
    segments still read correctly), that of the segment holding the byte."""
    archive = Archive(store.root)
    try:
        entry = archive.entry(model, path)
    finally:
        archive.close()
    cat = Catalog(store.catalog, readonly=True)
    extents = cat.extents(entry.file_id)
    cat.close()
    # The last sizeable chunk: used only by this file, and far from offset 0, so that the kernel's
    # read-ahead of a read at the start never touches it.
    big = max(x.location.length for x in extents)
    e = max((x for x in extents if x.location.length >= big // 2), key=lambda x: x.offset)
    pos = e.location.offset + int(e.location.length * at)
    with open(store.pack(e.location.pack), "r+b") as f:
        f.seek(e.location.offset)
        payload = f.read(e.location.length)
        f.seek(pos)
        f.write(bytes([payload[pos - e.location.offset] ^ 0x10]))
    return e.offset + _segment_start(payload, pos - e.location.offset, e.size)


def _segment_start(payload: bytes, at: int, size: int) -> int:
    """Plain offset, within its chunk, of the floatseg segment whose body holds payload byte `at`
    (0 for other codecs and for bytes outside the segments' bodies)."""
    from lmzfs.codecs import REGISTRY, parse_payload
    from lmzfs.codecs.floatseg import FloatSegCodec
    h = parse_payload(payload)
    codec = REGISTRY[h.codec_id]
    if not isinstance(codec, FloatSegCodec):
        return 0
    body_at = at - (len(payload) - len(h.body))
    lay = codec.layout(h.params, len(h.body), size)
    for s in lay.segments:
        if s.body <= body_at < s.body + s.length:
            return s.first * lay.model.val.itemsize
    return 0
