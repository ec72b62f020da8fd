"""floatsplit.decode_parts_together: every part of a float chunk decoded in one compiled call
(lmzfs/codecs/_tansparts.c) against the numpy reference, part by part: the same elements from
the same payloads, and the same error, message for message, from the same damage."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import ChunkHint, decode_chunk, decode_chunk_segments, encode_with, entropy
from lmzfs.codecs import kernels, parse_payload
from lmzfs.testing.tanspaths import compiled_then_numpy, value_or_error


@pytest.fixture(autouse=True)
def _compiled_loop_built():
    if kernels.compiled() is None:
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; `pip install -e .` builds it")


def _weights(n: int, seed: int, dtype: str) -> bytes:
    w = np.random.default_rng(seed).normal(0.0, 0.02, n).astype(np.float32)
    w[::29] *= 40
    w[::97] = 0.0
    if dtype == "BF16":
        return (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    return w.astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype]).tobytes()


WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(sorted(WIDTH)), n=st.integers(1, 9000), seed=st.integers(0, 2**32 - 1),
       codec=st.sampled_from(["floatseg", "floatsplit"]), rows=st.sampled_from([None, 1, 7, 64]),
       tail=st.booleans())
def test_both_paths_decode_every_float_chunk_to_its_bytes(small_segments, dtype, n, seed, codec, rows, tail):
    plain = _weights(n, seed, dtype) + (b"\x5a" if tail else b"")
    shape = None if rows is None or n % rows else (n // rows, rows)
    payload = encode_with(codec, plain, ChunkHint(dtype, WIDTH[dtype], shape=shape))
    assert compiled_then_numpy(lambda: decode_chunk(payload, len(plain))) == (plain, plain)


def test_wide_floats_holding_half_values_decode_through_zero_blocks_alike(small_segments):
    # float16 values held as float32: their low mantissa planes are zero in most 64-element blocks
    half = np.random.default_rng(3).normal(0, 0.05, 6000).astype(np.float16).astype(np.float32)
    half[1000:1100] += np.float32(1e-7)         # blocks whose low planes are not zero
    plain = half.tobytes()
    for codec in ("floatseg", "floatsplit"):
        payload = encode_with(codec, plain, ChunkHint("F32", 4))
        assert compiled_then_numpy(lambda: decode_chunk(payload, len(plain))) == (plain, plain)


def test_planes_coded_as_streams_are_merged_after_the_compiled_call(small_segments, monkeypatch):
    # float32 whose low 16 mantissa bits take 3 values: those planes code far below stored bytes
    rng = np.random.default_rng(5)
    bits = (rng.normal(0, 0.05, 8000).astype(np.float32).view(np.uint32) & ~np.uint32(0xFFFF)) | \
        rng.choice(np.array([0x1234, 0x0F0F, 0xBEEF], dtype=np.uint32), 8000)
    plain = bits.astype("<u4").tobytes()
    payload = encode_with("floatseg", plain, ChunkHint("F32", 4))
    modes = []
    decode_stream = entropy.decode_stream

    def spy(buf, *args, **kwargs):
        modes.append(bytes(buf[:1]))
        return decode_stream(buf, *args, **kwargs)

    monkeypatch.setattr(entropy, "decode_stream", spy)
    assert decode_chunk(payload, len(plain)) == plain
    assert modes and set(modes) <= {bytes((entropy.ZSTD,)), bytes((entropy.TANS,))}
    assert compiled_then_numpy(lambda: decode_chunk(payload, len(plain))) == (plain, plain)


@pytest.mark.parametrize("dtype, codec", [("BF16", "floatseg"), ("F32", "floatseg"), ("F16", "floatsplit")])
def test_every_flipped_body_byte_gives_both_paths_the_same_bytes_or_the_same_error(small_segments, dtype, codec):
    plain = _weights(2500, 11, dtype)
    payload = encode_with(codec, plain, ChunkHint(dtype, WIDTH[dtype]))
    body_at = len(payload) - len(parse_payload(payload).body)
    step = max(1, (len(payload) - body_at) // 400)
    for at in range(body_at, len(payload), step):
        bad = bytearray(payload)
        bad[at] ^= 0x24
        whole = compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk(bytes(bad), len(plain))))
        assert whole[0] == whole[1], at
        if codec == "floatseg":
            part = compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk_segments(bytes(bad), len(plain), 0, len(plain))))
            assert part[0] == part[1], at
