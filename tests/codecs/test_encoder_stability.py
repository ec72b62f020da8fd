"""The entropy-coded encoders' output, pinned: speed work on an encoder must not change a single byte it
writes (stored bytes are compared across tools and runs in docs/results.md). The digests were
recorded before the one-histogram model fit and the tails-only cost of entropy sections, and updated
once since, when the frequency tables' varints went from zstd level 19 to level 9 (uintlist.TABLE_LEVEL);
a deliberate change of the encoded format or the model choice updates them in the same commit, and says so."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lmzfs.codecs import decode_chunk, encode_with
from lmzfs.codecs.base import ChunkHint


def _cases():
    rng = np.random.default_rng(2026)
    w = rng.normal(0, 0.02, 1 << 18).astype(np.float32)
    rows = (w.view(np.uint32) >> 16).astype("<u2").reshape(512, 512).copy()
    # every 7th row a hundred times larger, so grouping rows into classes pays
    rows[::7] = (rng.normal(0, 2.0, (74, 512)).astype(np.float32).view(np.uint32) >> 16).astype("<u2")[:len(rows[::7])]
    yield "bf16-rows", "floatsplit", rows.tobytes(), ChunkHint("BF16", 2, shape=(512, 512))
    yield "f32-flat", "floatsplit", rng.standard_normal(1 << 16).astype("<f4").tobytes(), ChunkHint("F32", 4)
    yield "f16-odd", "floatsplit", rng.normal(0, 1, 77_777).astype("<f2").tobytes() + b"x", \
        ChunkHint("F16", 2, shape=(77_777,))
    yield "bf16-seg", "floatseg", rows.tobytes(), ChunkHint("BF16", 2, shape=(512, 512))
    rng = np.random.default_rng(2027)
    cols = np.clip(rng.normal(0, 1, (2048, 256)) * np.linspace(1, 40, 256)[None, :], -127, 127).astype(np.int8)
    yield "int8-cols", "entropy", cols.tobytes(), ChunkHint("I8", 1, shape=(2048, 256))


PINNED = {
    "bf16-rows": "0d6c3652b40a92a46fe46380fcb4c07c11fd8b766300fc45ae73fa1f57477f4d",
    "f32-flat": "dfd78f2eeb526afa8c60ce712e24c09c5c5eca56b9a98520db52ce0fdf1d7b03",
    "f16-odd": "6782bc6aa2c895c707c1447ba545844c15a99ed965c39c9c3d6e19258469e0a7",
    "bf16-seg": "03cd56629b170c3c306731007f2eb148bcdfd6034210ff88fb1a80a812be1098",
    "int8-cols": "751c5dfaeb8bd86ecebe92e2f4499b2f8257c60ed99c4e7df527e6a838c56c98",
}


@pytest.mark.parametrize("name,codec,data,hint", list(_cases()), ids=[c[0] for c in _cases()])
def test_the_entropy_coded_encoders_write_exactly_the_pinned_payload_and_it_decodes_back(name, codec, data, hint):
    payload = encode_with(codec, data, hint)
    assert hashlib.sha256(payload).hexdigest() == PINNED[name]
    assert decode_chunk(payload, len(data)) == data
