"""The delta codecs (xorzstd, ulpdelta) through the public seams: payloads coded against a reference
chunk round-trip exactly on adversarial pairs, the compiled and numpy paths write the same
payloads and decode the same bytes, hostile payloads and wrong references are refused, and
encode_delta_chunk keeps the smallest payload without ever failing on a dtype."""
from __future__ import annotations

import numpy as np
import pytest

from lmzfs.codecs import (CodecError, ChunkHint, DELTA_CODECS, decode_chunk, encode_delta_chunk,
                          encode_delta_with, parse_payload, tans)
from lmzfs.testing.hostile import within_bounds
from lmzfs.testing.tanspaths import compiled_then_numpy

FLOATS = {"BF16": 16, "F16": 16, "F32": 32, "F8_E4M3": 8, "F8_E5M2": 8}
INTS = {"I8": 8, "U8": 8}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def _bits(values, bits: int) -> bytes:
    return np.asarray(values, dtype=np.uint64).astype(_UINT[bits]).tobytes()


def _specials(bits: int) -> np.ndarray:
    """Every special bit pattern of a float of this width, as unsigned integers: signed zeros, the
    smallest and largest subnormals and normals, infinities or the format's top patterns, NaNs
    with payloads, both extremes of the key order."""
    top = (1 << bits) - 1
    sign = 1 << (bits - 1)
    patterns = {0, sign, 1, sign | 1, top, sign - 1, top >> 1, sign | 2, 3, sign - 2, top - 1}
    if bits == 16:
        patterns |= {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x03FF, 0x83FF, 0x7F80, 0xFF80, 0x7FC1, 0x007F}
    if bits == 32:
        patterns |= {0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x007FFFFF, 0x807FFFFF}
    return np.array(sorted(patterns), dtype=np.uint64)


def adversarial_pairs(bits: int, seed: int = 0) -> dict[str, tuple[bytes, bytes]]:
    """(new, reference) element pairs a delta coder gets wrong if any bit pattern is mishandled."""
    rng = np.random.default_rng(seed + bits)
    top = (1 << bits) - 1
    sign = 1 << (bits - 1)
    sp = _specials(bits)
    every = np.array(np.meshgrid(sp, sp)).reshape(2, -1)          # every special against every special
    near = rng.integers(0, 1 << bits, 3000, dtype=np.uint64)
    step = rng.integers(-3, 4, near.size).astype(np.int64)
    moved = ((near.astype(np.int64) + step) & top).astype(np.uint64)
    return {
        "specials against specials": (_bits(every[0], bits), _bits(every[1], bits)),
        "sign flips": (_bits(near ^ np.uint64(sign), bits), _bits(near, bits)),
        "zero crossings": (_bits(np.tile(np.array([1, sign | 1, 0, sign], dtype=np.uint64), 300), bits),
                           _bits(np.tile(np.array([sign | 1, 1, sign, 0], dtype=np.uint64), 300), bits)),
        "max-magnitude wraps": (_bits(np.tile(np.array([top, sign - 1, 0, sign], dtype=np.uint64), 300), bits),
                                _bits(np.tile(np.array([sign - 1, top, sign, 0], dtype=np.uint64), 300), bits)),
        "small steps of random patterns": (_bits(moved, bits), _bits(near, bits)),
        "all equal": (_bits(near, bits), _bits(near, bits)),
        "random bit patterns": (_bits(rng.integers(0, 1 << bits, 2000, dtype=np.uint64), bits),
                                _bits(rng.integers(0, 1 << bits, 2000, dtype=np.uint64), bits)),
        "one element": (_bits([sign | 5], bits), _bits([7], bits)),
    }


def _weights_pair(n: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 0.02, n).astype(np.float32)
    return ref + rng.normal(0, 2e-4, n).astype(np.float32), ref


def _bf16(a: np.ndarray) -> bytes:
    return (a.view(np.uint32) >> 16).astype("<u2").tobytes()


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS])
def test_ulpdelta_round_trips_every_adversarial_pair_exactly_with_and_without_a_trailing_byte(dtype):
    bits = {**FLOATS, **INTS}[dtype]
    hint = ChunkHint(dtype, bits // 8)
    for what, (new, ref) in adversarial_pairs(bits).items():
        for tail in (b"", b"\x81"):
            data, reference = new + tail * (bits > 8), ref + b"\x18" * (bits > 8) * len(tail)
            payload = encode_delta_with("ulpdelta", data, reference, hint)
            assert parse_payload(payload).codec_id == 8
            assert decode_chunk(payload, len(data), ref=reference) == data, (dtype, what, tail)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS])
def test_the_compiled_and_numpy_paths_write_identical_ulpdelta_payloads_and_decode_identical_bytes(dtype):
    bits = {**FLOATS, **INTS}[dtype]
    hint = ChunkHint(dtype, bits // 8)
    pairs = list(adversarial_pairs(bits, seed=9).values())
    new, ref = _weights_pair(20000)
    pairs.append((_bf16(new), _bf16(ref)) if bits == 16 else (new.tobytes(), ref.tobytes()) if bits == 32
                 else (bytes(_bf16(new)[1::2]), bytes(_bf16(ref)[1::2])))
    for data, reference in pairs:
        encoded = compiled_then_numpy(lambda: encode_delta_with("ulpdelta", data, reference, hint))
        assert encoded[0] == encoded[1]
        decoded = compiled_then_numpy(lambda: decode_chunk(encoded[0], len(data), ref=reference))
        assert decoded[0] == decoded[1] == data


def test_a_bf16_checkpoint_step_codes_smaller_with_ulpdelta_than_with_xorzstd():
    new, ref = _weights_pair(100000)
    data, reference = _bf16(new), _bf16(ref)
    ulp = encode_delta_with("ulpdelta", data, reference, ChunkHint("BF16", 2))
    xor = encode_delta_with("xorzstd", data, reference, ChunkHint("BF16", 2))
    assert len(ulp) < 0.75 * len(xor)
    best = encode_delta_chunk(data, reference, ChunkHint("BF16", 2))
    assert best.codec == "ulpdelta" and best.payload == ulp


def test_encode_delta_chunk_keeps_the_smallest_payload_of_the_codecs_that_apply():
    new, ref = _weights_pair(3000)
    cases = [(_bf16(new), _bf16(ref), ChunkHint("BF16", 2)), (new.tobytes(), ref.tobytes(), ChunkHint("F32", 4)),
             (bytes(300), bytes(300), ChunkHint("I8", 1)), (bytes(range(256)) * 8, bytes(range(256)) * 8, ChunkHint("U8", 1))]
    for data, reference, hint in cases:
        sizes = {c.name: len(encode_delta_with(c, data, reference, hint)) for c in DELTA_CODECS
                 if c.encode_delta(memoryview(data), memoryview(reference), hint) is not None}
        assert {"xorzstd", "ulpdelta"} <= set(sizes)
        best = encode_delta_chunk(data, reference, hint)
        assert len(best.payload) == min(sizes.values()), hint
        assert decode_chunk(best.payload, len(data), ref=reference) == data


@pytest.mark.parametrize("hint", [ChunkHint(), ChunkHint("F64", 8), ChunkHint("I32", 4),
                                  ChunkHint("BOOL", 1), ChunkHint("weird", 3)])
def test_dtypes_ulpdelta_does_not_code_fall_back_to_xorzstd_without_an_error(hint):
    data, reference = bytes(range(200)) * 5, bytes(range(1, 201)) * 5
    assert DELTA_CODECS[[c.name for c in DELTA_CODECS].index("ulpdelta")].encode_delta(
        memoryview(data), memoryview(reference), hint) is None
    with pytest.raises(ValueError, match="does not code"):
        encode_delta_with("ulpdelta", data, reference, hint)
    best = encode_delta_chunk(data, reference, hint)
    assert best.codec == "xorzstd" and decode_chunk(best.payload, len(data), ref=reference) == data


def test_ulpdelta_codes_block_chunks_without_a_layout_as_bytes_and_leaves_the_others_to_blockdelta():
    rng = np.random.default_rng(8)
    blocks = rng.integers(0, 256, (2000, 34), dtype=np.uint8)
    moved = blocks.copy()
    moved[:, 2:] = (moved[:, 2:].astype(np.int16) + rng.integers(-2, 3, (2000, 32))).astype(np.uint8)
    data, reference = moved.tobytes(), blocks.tobytes()
    hint = ChunkHint("IQ4_NL", 0, 34)        # a GGUF block type with no codec 5 layout
    ulp = encode_delta_with("ulpdelta", data, reference, hint)
    assert parse_payload(ulp).params[0] == 6          # the uint8 element format
    assert len(ulp) < len(encode_delta_with("xorzstd", data, reference, hint))
    assert encode_delta_chunk(data, reference, hint).payload == ulp
    assert decode_chunk(ulp, len(data), ref=reference) == data
    with pytest.raises(ValueError, match="does not code"):
        encode_delta_with("ulpdelta", data, reference, ChunkHint("Q8_0", 0, 34))
    assert encode_delta_chunk(data, reference, ChunkHint("Q8_0", 0, 34)).codec == "blockdelta"
    same = encode_delta_chunk(reference, reference, hint)
    assert decode_chunk(same.payload, len(reference), ref=reference) == reference


def test_an_empty_chunk_and_a_lone_trailing_byte_round_trip():
    for data, reference in ((b"", b""), (b"\x07", b"\x09"), (b"\x01\x02\x03", b"\x03\x02\x01")):
        payload = encode_delta_with("ulpdelta", data, reference, ChunkHint("F32", 4))
        assert decode_chunk(payload, len(data), ref=reference) == data


def test_ulpdelta_refuses_a_reference_of_another_size_or_none_or_the_wrong_bytes():
    new, ref = _weights_pair(4000)
    data, reference = _bf16(new), _bf16(ref)
    payload = encode_delta_with("ulpdelta", data, reference, ChunkHint("BF16", 2))
    with pytest.raises(CodecError, match="reference holds"):
        decode_chunk(payload, len(data), ref=reference[:-2])
    with pytest.raises(CodecError, match="needs a reference chunk"):
        decode_chunk(payload, len(data))
    other = bytearray(reference)
    other[10] ^= 1
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode_chunk(payload, len(data), ref=bytes(other))
    assert decode_chunk(payload, len(data), ref=bytes(other), hash_checked=True) != data
    with pytest.raises(ValueError, match="reference of"):
        encode_delta_chunk(data, reference[:-2], ChunkHint("BF16", 2))


def _ulp_payload(size: int, params: bytes, body: bytes) -> bytes:
    from lmzfs.codecs.base import put_varint
    return b"LC\x01\x08" + put_varint(size) + put_varint(len(params)) + params + body


def test_hostile_ulpdelta_payloads_are_refused_with_codec_errors():
    new, ref = _weights_pair(5000)
    data, reference = _bf16(new), _bf16(ref)
    payload = encode_delta_with("ulpdelta", data, reference, ChunkHint("BF16", 2))
    h = parse_payload(payload)
    params, body, n = bytes(h.params), bytes(h.body), len(data)
    hostile = {
        "truncated body": payload[:-1],
        "longer body": payload + b"\x00",
        "truncated params": _ulp_payload(n, params[:6], body),
        "unknown format": _ulp_payload(n, bytes((99,)) + params[1:], body),
        "too many refinement bits": _ulp_payload(n, params[:1] + b"\x0f" + params[2:], body),
        "table log out of range": _ulp_payload(n, params[:2] + b"\x1f" + params[3:], body),
        "no contexts": _ulp_payload(n, params[:3] + b"\x00" + params[4:], body),
        "too many contexts": _ulp_payload(n, params[:3] + b"\x11" + params[4:], body),
        "tables cut short": _ulp_payload(n, params[:-3], body),
        "a table value flipped": _ulp_payload(n, params[:-1] + bytes((params[-1] ^ 0x40,)), body),
        "a stream bit flipped": payload[:len(payload) - len(body)] + bytes((body[0] ^ 1,)) + body[1:],
        "a stored bit flipped": payload[:-5] + bytes((payload[-5] ^ 0x10,)) + payload[-4:],
    }
    for what, bad in hostile.items():
        with pytest.raises(CodecError):
            decode_chunk(bad, len(data), ref=reference)
            pytest.fail(what)
    with pytest.raises(CodecError):
        decode_chunk(payload, len(data) - 2, ref=reference[:-2])


def test_random_corruptions_of_ulpdelta_payloads_never_decode_to_other_bytes_or_crash():
    new, ref = _weights_pair(3000, seed=5)
    rng = np.random.default_rng(11)
    for dtype, (data, reference) in (("BF16", (_bf16(new), _bf16(ref))), ("F32", (new.tobytes(), ref.tobytes()))):
        payload = encode_delta_with("ulpdelta", data, reference, ChunkHint(dtype, 2 if dtype == "BF16" else 4))
        for _ in range(150):
            bad = bytearray(payload)
            for i in rng.integers(4, len(bad), rng.integers(1, 4)):
                bad[i] ^= 1 << int(rng.integers(0, 8))
            try:
                out = decode_chunk(bytes(bad), len(data), ref=reference)
            except CodecError:
                continue
            assert out == data


def test_hostile_ulpdelta_params_claiming_huge_lanes_or_streams_are_refused_quickly_and_small():
    from lmzfs.codecs.base import put_varint
    size = 1 << 20
    reference = bytes(size)
    for lanes, slen, rlen in ((1 << 30, 1, 1), (1, 1 << 40, 1), (1, 1, 1 << 40), (size, 0, 0)):
        params = bytes((2, 3, 15, 16)) + b"".join(put_varint(c) for c in range(1, 16)) + put_varint(lanes) + \
            bytes(4) + put_varint(slen) + put_varint(rlen) + b"\x00" + bytes(16 * 240)
        payload = b"LC\x01\x08" + put_varint(size) + put_varint(len(params)) + params + b"\x00" * 64
        with within_bounds("refusing hostile ulpdelta params", seconds=2.0, peak_bytes=64 << 20):
            with pytest.raises(CodecError):
                decode_chunk(payload, size, ref=reference)


def _pinned_cases():
    new, ref = _weights_pair(1 << 17, seed=2026)
    yield "bf16-step", _bf16(new), _bf16(ref), ChunkHint("BF16", 2)
    yield "f32-step", new[: 1 << 15].tobytes(), ref[: 1 << 15].tobytes(), ChunkHint("F32", 4)
    rng = np.random.default_rng(2027)
    i8 = np.clip(np.rint(rng.laplace(0, 6, 50_000)), -127, 127).astype(np.int8)
    i8b = np.clip(i8 + np.rint(rng.normal(0, 1.5, i8.size)), -127, 127).astype(np.int8)
    yield "int8-release", i8b.tobytes(), i8.tobytes(), ChunkHint("I8", 1)


# ulpdelta's output, pinned as test_encoder_stability.py pins the other entropy coders': speed
# work on its encoder must not change a byte; a deliberate change of its choices updates these
# (as the frequency tables' zstd level did: uintlist.TABLE_LEVEL).
PINNED = {
    "bf16-step": "b03df34a2d19238a951823bc845d14e7179bd709acb7010a84e54f280d9424ba",
    "f32-step": "49c57808b42cde02dbfe09a8fbd09af90f3a7ca605711b51e6900683b418a505",
    "int8-release": "722530742169760b45d7321d97ae5510e6bd69dbbaf706c1e3d9dec3e2418d32",
}


@pytest.mark.parametrize("name,data,reference,hint", list(_pinned_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_ulpdelta_writes_exactly_the_pinned_payloads(name, data, reference, hint):
    import hashlib
    payload = encode_delta_with("ulpdelta", data, reference, hint)
    assert decode_chunk(payload, len(data), ref=reference) == data
    assert hashlib.sha256(payload).hexdigest() == PINNED[name]


def test_threads_decoding_ulpdelta_payloads_at_once_each_get_their_own_bytes():
    from concurrent.futures import ThreadPoolExecutor
    pairs = []
    for seed in range(6):
        new, ref = _weights_pair(30000, seed=seed)
        data, reference = (_bf16(new), _bf16(ref)) if seed % 2 else (new.tobytes(), ref.tobytes())
        hint = ChunkHint("BF16", 2) if seed % 2 else ChunkHint("F32", 4)
        pairs.append((encode_delta_with("ulpdelta", data, reference, hint), data, reference))

    def work(i: int) -> bool:
        payload, data, reference = pairs[i % len(pairs)]
        return all(decode_chunk(payload, len(data), ref=reference) == data for _ in range(5))

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(work, range(12)))
