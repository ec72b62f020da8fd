"""Codec 6, floatseg: a float chunk in segments that decode on their own, sharing one model."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import (SEGMENT_BYTES, ChunkHint, CodecError, decode_chunk, decode_chunk_segments,
                          decode_segments_from, encode_chunk, encode_with, floatseg, parse_payload)
from lmzfs.codecs.base import get_varint, put_varint
from lmzfs.testing import hostile

FIXTURES = Path(__file__).parent.parent / "fixtures" / "codecs"
quick = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def _both_tans_paths(tans_loop):
    """Every test here runs once through the compiled tANS loop and once through numpy."""
    return tans_loop


def weights(n: int, seed: int = 0, dtype: str = "BF16") -> bytes:
    w = np.random.default_rng(seed).normal(0.0, 0.02, n).astype(np.float32)
    w[::37] *= 20
    w[::101] = 0.0
    if dtype == "BF16":
        return (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    return w.astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype]).tobytes()


def decode_chunk_segment(payload: bytes, size: int, offset: int) -> tuple[int, bytes]:
    """The segment holding plain byte `offset`."""
    (got,) = decode_chunk_segments(payload, size, offset, offset + 1)
    return got


def segments_of(payload: bytes) -> list[floatseg.Segment]:
    h = parse_payload(payload)
    return floatseg.FloatSegCodec().layout(h.params, len(h.body), h.size).segments


def assert_every_offset_decodes_its_own_segment(payload: bytes, plain: bytes, step: int) -> None:
    seen = set()
    for off in sorted({*range(0, len(plain), step), len(plain) - 1}):
        start, seg = decode_chunk_segment(payload, len(plain), off)
        assert start <= off < start + len(seg)
        assert seg == plain[start:start + len(seg)]
        seen.add(start)
    assert len(seen) == len(segments_of(payload))


def test_every_committed_floatseg_fixture_decodes_segment_by_segment():
    found = sorted(FIXTURES.glob("*.floatseg.v1.payload"))
    assert len(found) >= 4
    for path in found:
        plain = (FIXTURES / f"{path.name.split('.')[0]}.plain").read_bytes()
        payload = path.read_bytes()
        assert len(segments_of(payload)) >= 3, path.name
        assert decode_chunk(payload, len(plain)) == plain
        assert_every_offset_decodes_its_own_segment(payload, plain, 1000)


@pytest.mark.parametrize("dtype,width", [("BF16", 2), ("F16", 2), ("F32", 4), ("F64", 8)])
def test_segments_round_trip_every_float_format_with_a_trailing_byte(small_segments, dtype, width):
    plain = weights(9000 // width * 2, 3, dtype) + b"\x05"
    payload = encode_with("floatseg", plain, ChunkHint(dtype, width))
    assert decode_chunk(payload, len(plain)) == plain
    assert decode_chunk(payload, len(plain), hash_checked=True) == plain
    assert_every_offset_decodes_its_own_segment(payload, plain, 777)


def test_row_class_contexts_carry_across_segments_that_start_mid_row(small_segments):
    rng = np.random.default_rng(5)
    rows = (rng.normal(0, 1, (48, 300)) * np.exp(rng.normal(-4, 1.5, (48, 1)))).astype(np.float32)
    plain = (rows.view(np.uint32) >> 16).astype("<u2").tobytes()
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2, 0, (60, 300), 300 * 2 * 7))
    assert parse_payload(payload).params[4] == 0xFF          # row classes were chosen
    assert_every_offset_decodes_its_own_segment(payload, plain, 1500)


@quick
@given(st.integers(1, 5000), st.sampled_from(["BF16", "F16", "F32"]), st.integers(0, 2**32 - 1),
       st.binary(max_size=3))
def test_any_float_bits_round_trip_whole_and_by_segment(n, dtype, seed, tail):
    # hypothesis cannot take a function-scoped fixture: segments of 4 KiB set by hand
    old, floatseg.SEGMENT_LOG = floatseg.SEGMENT_LOG, 12
    try:
        width = 4 if dtype == "F32" else 2
        bits = np.random.default_rng(seed).integers(0, 1 << (8 * width), n, dtype=np.uint64)
        plain = bits.astype(f"<u{width}").tobytes() + tail[:width - 1]
        payload = encode_with("floatseg", plain, ChunkHint(dtype, width))
    finally:
        floatseg.SEGMENT_LOG = old
    assert decode_chunk(payload, len(plain)) == plain
    start, seg = decode_chunk_segment(payload, len(plain), len(plain) - 1)
    assert seg == plain[start:]


def test_a_range_decodes_every_segment_it_touches_and_no_other(small_segments):
    plain = weights(20000, 12)
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2))
    got = decode_chunk_segments(payload, len(plain), 4096 - 1, 3 * 4096 + 1)
    assert [a for a, _ in got] == [0, 4096, 8192, 12288]
    assert b"".join(d for _, d in got) == plain[:4 * 4096]
    assert [a for a, _ in decode_chunk_segments(payload, len(plain), 4096, 8192)] == [4096]


class RecordingReads:
    """read(start, n) over a payload, remembering what was asked; `short` cuts reads from there."""

    def __init__(self, payload: bytes, short: int | None = None):
        self.payload, self.short, self.asked = payload, short, []

    def __call__(self, start: int, n: int) -> bytes:
        self.asked.append((start, n))
        stop = start + n if self.short is None else min(start + n, self.short)
        return self.payload[start:stop]


def test_a_segment_read_fetches_the_params_then_only_that_segments_body(small_segments):
    plain = weights(20000, 14) + b"\x7f"           # ten segments and a trailing byte
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2))
    body_at = len(payload) - len(parse_payload(payload).body)
    segs = segments_of(payload)
    reads = RecordingReads(payload)
    got = decode_segments_from(reads, len(payload), len(plain), 3 * 4096 + 7, 3 * 4096 + 8)
    assert got == [(3 * 4096, plain[3 * 4096:4 * 4096])]
    assert reads.asked == [(0, 4096), (body_at + segs[3].body, segs[3].length)]
    # a range: the bodies of the segments it touches, in one read; the last one's trailing byte too
    reads = RecordingReads(payload)
    got = decode_segments_from(reads, len(payload), len(plain), 8 * 4096, len(plain))
    assert b"".join(d for _, d in got) == plain[8 * 4096:] and [a for a, _ in got] == [8 * 4096, 9 * 4096]
    assert reads.asked[1] == (body_at + segs[8].body, len(payload) - body_at - segs[8].body)
    assert sum(n for _, n in reads.asked) < len(payload) // 3


def test_params_longer_than_the_first_read_are_read_whole(small_segments):
    plain = weights(9000, 15)
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2))
    reads = RecordingReads(payload)
    got = decode_segments_from(reads, len(payload), len(plain), 4096, 4097, head=24)
    params_end = len(payload) - len(parse_payload(payload).body)
    assert got == [(4096, plain[4096:8192])] and reads.asked[:2] == [(0, 24), (0, params_end)]


def test_a_payload_cut_short_under_a_segment_read_is_a_codec_error(small_segments):
    plain = weights(9000, 16)
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2))
    body_at = len(payload) - len(parse_payload(payload).body)
    for short in (3, 6, body_at - 1, len(payload) - 1):
        with pytest.raises(CodecError, match="truncated|cut short"):
            decode_segments_from(RecordingReads(payload, short), len(payload), len(plain), len(plain) - 1,
                                 len(plain), head=24)
    with pytest.raises(CodecError, match="runs past"):
        decode_segments_from(RecordingReads(payload), body_at - 2, len(plain), 0, 1)
    other = encode_with("floatsplit", plain, ChunkHint("BF16", 2))
    reads = RecordingReads(other)
    assert decode_segments_from(reads, len(other), len(plain), 0, 1) is None and len(reads.asked) == 1


def test_a_flipped_byte_fails_its_segment_and_the_chunk_but_not_the_other_segments(small_segments):
    plain = weights(12000, 8)
    payload = bytearray(encode_with("floatseg", plain, ChunkHint("BF16", 2)))
    segs = segments_of(bytes(payload))
    body_at = len(payload) - len(parse_payload(bytes(payload)).body)
    victim = segs[2]
    payload[body_at + victim.body + victim.length // 2] ^= 0x08
    bad = bytes(payload)
    with pytest.raises(CodecError):
        decode_chunk(bad, len(plain))
    with pytest.raises(CodecError):
        decode_chunk_segment(bad, len(plain), victim.first * 2 + 10)
    for s in segs:
        if s is not victim:
            start, seg = decode_chunk_segment(bad, len(plain), s.first * 2)
            assert seg == plain[start:start + len(seg)]


def test_malformed_params_and_bodies_are_codec_errors(small_segments):
    plain = weights(6000, 9)
    payload = encode_with("floatseg", plain, ChunkHint("BF16", 2))
    h = parse_payload(payload)
    head = payload[:len(payload) - len(h.body) - len(h.params)]
    params, body = bytes(h.params), bytes(h.body)
    assert params[4] != 0xFF                      # no row classes: emin and E follow c0
    seglog_at = get_varint(params, get_varint(params, 5, "emin")[1], "E")[1]
    assert params[seglog_at] == 12

    def rebuilt(p: bytes, b: bytes) -> bytes:
        return b"LC\x01\x06" + put_varint(len(plain)) + put_varint(len(p)) + p + b

    assert rebuilt(params, body) == payload and head.startswith(b"LC\x01\x06")
    cases = {
        "truncated body": rebuilt(params, body[:-1]),
        "extended body": rebuilt(params, body + b"\x00"),
        "segment size too small": rebuilt(params[:seglog_at] + b"\x0b" + params[seglog_at + 1:], body),
        "segment size too large": rebuilt(params[:seglog_at] + b"\x19" + params[seglog_at + 1:], body),
        "a record too many": rebuilt(params + b"\x01", body),
        "a record short": rebuilt(params[:-1], body),
    }
    for what, bad in cases.items():
        with pytest.raises(CodecError):
            decode_chunk(bad, len(plain))
        with pytest.raises(CodecError):
            decode_chunk_segment(bad, len(plain), 0)
    with pytest.raises(CodecError):
        decode_chunk_segment(payload, len(plain) + 2, 0)     # the catalog's size must match
    with pytest.raises(ValueError, match="outside"):
        decode_chunk_segment(payload, len(plain), len(plain))
    with pytest.raises(ValueError, match="outside"):
        decode_chunk_segments(payload, len(plain), 10, 10)
    hostile.assert_rejected_quickly_and_small(cases["a record short"], len(plain), seconds=1.0,
                                              peak_bytes=64 * len(plain))


def test_chunks_over_a_segment_get_floatseg_unless_asked_not_to_and_cost_about_what_floatsplit_does():
    plain = weights(3 * SEGMENT_BYTES // 2 + 1000, 11)
    assert encode_chunk(plain, ChunkHint("BF16", 2), segments=False).codec == "floatsplit"
    enc = encode_chunk(plain, ChunkHint("BF16", 2))
    assert enc.codec == "floatseg" and len(segments_of(enc.payload)) == 4
    whole = encode_with("floatsplit", plain, ChunkHint("BF16", 2))
    assert len(enc.payload) <= len(whole) * 1.002
    assert encode_chunk(plain[:SEGMENT_BYTES], ChunkHint("BF16", 2), segments=True).codec == "floatsplit"
    assert decode_chunk_segments(encode_with("floatsplit", plain[:4096], ChunkHint("BF16", 2)), 4096, 0, 1) is None


def test_a_chunk_of_more_than_a_mebibyte_codes_an_exponent_seen_only_at_a_segments_lane_start():
    # 2 MiB of BF16 in runs of one magnitude (so the model keeps contexts of the previous
    # exponent). As one part the chunk would start a lane every 64 elements; its 256 KiB segments
    # each start one every 32. A tiny value that occurs once, at element 96, right after the
    # largest one: the fit sees it in the largest exponent's context, but element 96 starts a lane
    # of the first segment and is coded in the lane-start context: the model must have counted it
    # there, or the chunk would not encode at all (`lmz add --chunk-size 4M` of real models did
    # not, before).
    rng = np.random.default_rng(1)
    n = 1 << 20
    w = (rng.normal(0, 1, n) * np.repeat(10.0 ** rng.uniform(-4, 0, n // 256), 256)).astype(np.float32)
    w[95], w[96] = 1e4, 1e-30
    data = (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    hint = ChunkHint("BF16", 2)
    payload = encode_with("floatseg", data, hint)
    assert decode_chunk(payload, len(data)) == data
    assert decode_chunk_segment(payload, len(data), 96 * 2) == (0, data[:SEGMENT_BYTES])
    chosen = encode_chunk(data, hint)
    assert chosen.codec == "floatseg" and decode_chunk(chosen.payload, len(data)) == data
