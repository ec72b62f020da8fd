"""The tANS engine and the codecs built on it: floatsplit (3), entropy (4), ggufblocks (5)."""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import (
    FORMAT_VERSION, MAGIC, REGISTRY, ChunkHint, CodecError, decode_chunk, encode_chunk, encode_with,
    parse_payload,
)
from lmzfs.codecs import entropy, tans, uintlist
from lmzfs.codecs.base import put_varint
from lmzfs.codecs.floatsplit import FORMATS
from lmzfs.codecs.ggufblocks import LAYOUTS
from lmzfs.testing import hostile


@pytest.fixture(scope="module", autouse=True)
def _both_tans_paths(tans_loop):
    """Every test here runs once through the compiled tANS loop and once through numpy."""
    return tans_loop

FIXTURES = Path(__file__).parent / "fixtures" / "codecs"
quick = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
FLOAT_HINTS = [ChunkHint(name, bits // 8) for name, bits, *_ in FORMATS.values()]
QUANT_HINTS = [ChunkHint(name, 0, size) for name, size, _ in LAYOUTS.values()]
SPECIAL = {1: [0x00, 0x80, 0x7F, 0xFF, 0x78, 0x7C, 0x01],
           2: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE5A, 0x0001, 0x83FF, 0x7F80, 0xFF80, 0x7FC1],
           4: [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x807FFFFF],
           8: [0, 1 << 63, 0x7FF0000000000000, 0xFFF8DEADBEEF0001, 1, 0x800FFFFFFFFFFFFF]}
UINT = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def weights(n: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).normal(0.0, 0.02, n).astype(np.float32)
    w[::37] *= 20
    return w


def as_dtype(w: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    if dtype.startswith("F8"):
        return (w.astype(np.float16).view(np.uint16) >> 8).astype(np.uint8).tobytes()
    return w.astype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype]).tobytes()


def q4_1_blocks(n: int, seed: int = 0) -> bytes:
    w = weights(n * 32, seed).reshape(n, 32)
    lo, hi = w.min(1), w.max(1)
    d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
    q = np.clip(np.rint((w - m[:, None].astype(np.float32)) / d[:, None].astype(np.float32)), 0, 15).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([d.view(np.uint8).reshape(n, 2), m.view(np.uint8).reshape(n, 2), qs], axis=1).tobytes()


def codec_of(payload: bytes) -> str:
    return REGISTRY[parse_payload(payload).codec_id].name


# --- the engine ---------------------------------------------------------------------------------

@quick
@given(counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=300), R=st.integers(9, 15))
def test_quantize_sums_to_the_table_size_and_keeps_every_used_symbol(counts, R):
    c = np.array(counts)
    if not c.any() or (c > 0).sum() > 1 << R:
        return
    f = tans.quantize(c, R)
    assert f.sum() == 1 << R
    assert ((f > 0) == (c > 0)).all()
    assert np.array_equal(f, tans.quantize(c, R))


@quick
@given(n=st.integers(1, 3000), lanes=st.integers(1, 5000), S=st.integers(1, 40), K=st.integers(1, 4),
       mode=st.sampled_from(["plain", "ctx", "dyn", "interleaved"]), seed=st.integers(0, 2**32 - 1))
def test_tans_round_trips_every_layout_context_and_bits_back(n, lanes, S, K, mode, seed):
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(0.3, n) - 1, S - 1)
    R = 10
    freqs = np.stack([tans.quantize(np.bincount(sym, minlength=S) + 1, R) for _ in range(K)])
    tab = tans.Tables(freqs, R)
    kw: dict = {}
    if mode in ("ctx", "interleaved"):
        kw["ctx"] = rng.integers(0, K, n)
    if mode == "dyn":
        kw["dyn"] = (rng.integers(0, K, S), int(rng.integers(0, K)))
    il = mode == "interleaved"
    wp = tans.layout(n, lanes, il)[1]
    bb = rng.integers(0, 1 << R, wp)
    stream = tans.encode(sym, tab, lanes, bits_back=bb, interleaved=il, **kw)
    out, fin = tans.decode(stream, n, tab, lanes, interleaved=il, **kw)
    assert np.array_equal(out, sym) and np.array_equal(fin, bb)


def test_tans_codes_within_a_fraction_of_a_percent_of_the_entropy():
    rng = np.random.default_rng(3)
    sym = np.minimum(rng.geometric(0.2, 200_000) - 1, 63)
    c = np.bincount(sym)
    p = c[c > 0] / c.sum()
    ideal = -(p * np.log2(p)).sum() * len(sym) / 8
    sec = entropy.tans_section(sym, 64)
    assert len(sec) < ideal * 1.004
    assert np.array_equal(entropy.decode_tans_section(sec, len(sym), 64), sym)


@quick
@given(stream=st.binary(max_size=400), n=st.integers(1, 500), lanes=st.integers(1, 64))
def test_tans_decoding_garbage_raises_or_returns_n_symbols(stream, n, lanes):
    tab = tans.Tables(np.array([tans.quantize(np.array([5, 3, 1, 1]), 8)]), 8)
    try:
        out, fin = tans.decode(stream, n, tab, lanes)
    except CodecError:
        return
    assert len(out) == n and (out < 4).all()


@pytest.mark.parametrize("bad", [np.array([[1, 2, 3]]), np.array([[256, 1]]), np.array([[-1, 257]])])
def test_tables_that_do_not_sum_to_the_table_size_raise(bad):
    with pytest.raises(CodecError):
        tans.Tables(bad, 8)


# --- round trips through the codecs --------------------------------------------------------------

def float_data() -> st.SearchStrategy[tuple[bytes, ChunkHint]]:
    def make(t):
        raw, specials, hint, n, seed, tail = t
        k = hint.itemsize
        pool = SPECIAL[k]
        extra = np.array([pool[i % len(pool)] for i in specials], dtype=UINT[k]).tobytes()
        w = as_dtype(weights(n, seed), hint.dtype)
        return raw[: len(raw) // k * k] + extra + w + tail, hint
    return st.tuples(st.binary(max_size=2000), st.lists(st.integers(0, 99), max_size=80),
                     st.sampled_from(FLOAT_HINTS), st.integers(0, 3000), st.integers(0, 2**32 - 1),
                     st.binary(max_size=9)).map(make)


@quick
@given(case=float_data())
def test_floatsplit_round_trips_any_bit_pattern_bit_exactly(case):
    data, hint = case
    payload = encode_with("floatsplit", data, hint)
    assert codec_of(payload) == "floatsplit"
    assert decode_chunk(payload, len(data)) == data
    assert decode_chunk(encode_chunk(data, hint).payload, len(data)) == data


@quick
@given(raw=st.binary(max_size=3000), hint=st.sampled_from(QUANT_HINTS), blocks=st.integers(0, 200),
       seed=st.integers(0, 2**32 - 1), tail=st.binary(max_size=40))
def test_ggufblocks_round_trips_any_bytes_and_partial_blocks(raw, hint, blocks, seed, tail):
    data = raw + (q4_1_blocks(blocks, seed) if hint.dtype == "Q4_1" else b"") + tail
    payload = encode_with("ggufblocks", data, hint)
    assert decode_chunk(payload, len(data)) == data
    assert decode_chunk(encode_chunk(data, hint).payload, len(data)) == data


@quick
@given(data=st.one_of(st.binary(max_size=3000),
                      st.tuples(st.integers(1, 20000), st.floats(0.1, 30), st.integers(0, 2**32 - 1)).map(
                          lambda t: np.clip(np.rint(np.random.default_rng(t[2]).laplace(0, t[1], t[0])),
                                            -128, 127).astype(np.int8).tobytes())))
def test_entropy_round_trips_any_bytes(data):
    payload = encode_with("entropy", data)
    assert decode_chunk(payload, len(data)) == data
    assert decode_chunk(encode_chunk(data, ChunkHint("I8", 1)).payload, len(data)) == data


@pytest.mark.parametrize("hint", FLOAT_HINTS + QUANT_HINTS + [ChunkHint("I8", 1)], ids=lambda h: h.dtype)
def test_short_and_empty_chunks_round_trip(hint):
    name = "floatsplit" if hint in FLOAT_HINTS else "ggufblocks" if hint in QUANT_HINTS else "entropy"
    for n in range(0, 12):
        data = bytes(range(200, 200 + n))
        assert decode_chunk(encode_with(name, data, hint), n) == data


# --- codec choice and what it achieves -------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["BF16", "F32"])
def test_encode_chunk_picks_floatsplit_for_weights_and_beats_bytegroup(dtype):
    data = as_dtype(weights(100_000, 5), dtype)
    hint = ChunkHint(dtype, {"BF16": 2, "F32": 4}[dtype])
    enc = encode_chunk(data, hint)
    assert enc.codec == "floatsplit"
    assert len(enc.payload) < len(encode_with("bytegroup", data, hint))


def test_encode_chunk_picks_ggufblocks_for_q4_1_and_entropy_for_int8():
    data = q4_1_blocks(5000, 1)
    enc = encode_chunk(data, ChunkHint("Q4_1", 0, 20))
    assert enc.codec == "ggufblocks" and len(enc.payload) < len(encode_with("zstd", data))
    i8 = np.clip(np.rint(np.random.default_rng(2).laplace(0, 3, 200_000)), -128, 127).astype(np.int8).tobytes()
    enc = encode_chunk(i8, ChunkHint("I8", 1))
    assert enc.codec == "entropy" and len(enc.payload) < len(encode_with("zstd", i8))


def int8_columns(rows: int, cols: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    spread = np.exp(rng.normal(1.0, 1.0, cols))
    return np.clip(np.rint(rng.laplace(0, 1, (rows, cols)) * spread), -128, 127).astype(np.int8).tobytes()


def test_entropy_gives_columns_of_different_spread_their_own_tables():
    data = int8_columns(400, 256)
    hint = ChunkHint("I8", 1, 0, (400, 256), 0)
    payload = encode_with("entropy", data, hint)
    assert parse_payload(payload).params[4] == 1          # column classes were used
    assert len(payload) < len(encode_with("entropy", data)) * 0.97
    assert decode_chunk(payload, len(data)) == data


@pytest.mark.parametrize("shape", [(64, 256), (300, 8), (7, 1000)])
def test_floatsplit_row_classes_round_trip_from_any_offset(shape):
    w = weights(shape[0] * shape[1], 9).reshape(shape) * np.exp(np.random.default_rng(1).normal(0, 2, (shape[0], 1)))
    data = as_dtype(w.astype(np.float32).ravel(), "BF16")
    for offset in (0, 2, 2 * shape[1] - 6):
        hint = ChunkHint("BF16", 2, 0, shape, offset)
        payload = encode_with("floatsplit", data, hint)
        assert decode_chunk(payload, len(data)) == data


# --- corrupt, truncated and hostile payloads ------------------------------------------------------

def corruption_cases() -> list[bytes]:
    return [encode_with("floatsplit", as_dtype(weights(300, 1), "BF16") + b"\x01", ChunkHint("BF16", 2)),
            encode_with("floatsplit", as_dtype(weights(200, 2), "F32"), ChunkHint("F32", 4)),
            encode_with("ggufblocks", q4_1_blocks(12, 3) + b"\x09", ChunkHint("Q4_1", 0, 20)),
            encode_with("entropy", np.clip(np.rint(np.random.default_rng(4).laplace(0, 2, 600)), -128, 127)
                        .astype(np.int8).tobytes()),
            encode_with("entropy", int8_columns(40, 32, 5), ChunkHint("I8", 1, 0, (40, 32), 0)),
            encode_with("floatsplit", as_dtype(weights(400, 6), "BF16"), ChunkHint("BF16", 2, 0, (20, 20), 0))]


@pytest.mark.parametrize("case", range(6))
def test_flipping_any_bit_raises_or_decodes_the_same_bytes(case):
    payload = corruption_cases()[case]
    h = parse_payload(payload)
    plain = decode_chunk(payload, h.size)
    for i in range(len(payload)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(payload)
            bad[i] ^= mask
            try:
                out = decode_chunk(bytes(bad), len(plain))
            except CodecError:
                continue
            assert out == plain, f"flip {mask:#x} at byte {i} of case {case} returned other bytes"


@pytest.mark.parametrize("case", range(6))
def test_a_wrong_codec_crc_raises_unless_the_caller_checks_a_hash_itself(case):
    payload = corruption_cases()[case]
    plain = decode_chunk(payload, parse_payload(payload).size)
    crc = zlib.crc32(plain).to_bytes(4, "little")
    assert payload.count(crc) == 1
    bad = payload.replace(crc, bytes(b ^ 0x5A for b in crc))
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode_chunk(bad, len(plain))
    assert decode_chunk(bad, len(plain), hash_checked=True) == plain
    assert decode_chunk(payload, len(plain), hash_checked=True) == plain


@pytest.mark.parametrize("case", range(6))
def test_truncated_or_extended_payloads_raise(case):
    payload = corruption_cases()[case]
    size = parse_payload(payload).size
    for n in range(len(payload)):
        with pytest.raises(CodecError):
            decode_chunk(payload[:n], size)
    for extra in (b"\x00", b"\xff\xff", payload[-5:]):
        with pytest.raises(CodecError):
            decode_chunk(payload + extra, size)


def assert_rejected_quickly_and_small(payload: bytes, size: int) -> None:
    hostile.assert_rejected_quickly_and_small(payload, size, seconds=2.0, peak_bytes=max(4 << 20, 64 * size))


def test_hostile_floatsplit_params_cannot_make_the_decoder_allocate_much():
    size = 64
    crc = (0).to_bytes(4, "little")
    for fmt, R, nb, lanes, E in [(3, 15, 16, 1, 2048), (2, 15, 16, 10**6, 256), (0, 15, 16, 16, 256),
                                 (3, 15, 16, 8, 2047)]:
        k = FORMATS[fmt][4]
        params = bytes((fmt, k, R, nb, 0)) + put_varint(lanes) + put_varint(0) + put_varint(E) + crc + \
            put_varint(10) + b"\x00" + b"\x00" * 50
        payload = MAGIC + bytes((FORMAT_VERSION, 3)) + put_varint(size) + put_varint(len(params)) + params + b"\x00" * 40
        assert_rejected_quickly_and_small(payload, size)


def test_hostile_tans_sections_cannot_make_the_decoder_allocate_much():
    size = 100
    for R, g, lanes, K in [(15, 0, 1, 1), (15, 1, 100, 1), (14, 8, 5, 1)]:
        blob = b"\x00" + b"\x01" * 256
        sec = bytes((R, g)) + put_varint(lanes) + put_varint(len(blob)) + blob + b"\xff" * 30
        params = zlib.crc32(b"").to_bytes(4, "little")
        payload = MAGIC + bytes((FORMAT_VERSION, 4)) + put_varint(size) + put_varint(len(params)) + params + sec
        assert_rejected_quickly_and_small(payload, size)


def test_a_payload_claiming_a_huge_size_is_rejected_before_allocating():
    payload = encode_with("entropy", b"abc" * 100)
    h = parse_payload(payload)
    forged = MAGIC + bytes((FORMAT_VERSION, 4)) + put_varint(1 << 34) + put_varint(len(h.params)) + \
        bytes(h.params) + bytes(h.body)
    assert_rejected_quickly_and_small(forged, 1 << 34)


# --- committed fixtures -------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["floatsplit", "entropy", "ggufblocks"])
def test_committed_fixtures_of_the_tans_codecs_decode(codec):
    payloads = sorted(FIXTURES.glob(f"*.{codec}.v1.payload"))
    assert len(payloads) >= 3
    for path in payloads:
        name = path.name.split(".")[0]
        plain = (FIXTURES / f"{name}.plain").read_bytes()
        assert codec_of(path.read_bytes()) == codec
        assert decode_chunk(path.read_bytes(), len(plain)) == plain, path.name


def _through_both_loops(compute, errors=(CodecError,)) -> list:
    """compute() run through the compiled tANS loop, then through the numpy one: each result, or
    the message of an error in ``errors`` (so that the two paths can be compared as values)."""
    saved, results = tans._loop, []
    try:
        for loop in (saved, None):
            tans._loop = loop
            try:
                results.append(compute())
            except errors as exc:
                results.append(str(exc))
    finally:
        tans._loop = saved
    return results


@pytest.mark.parametrize("S,R,K", [(2, 4, 1), (7, 5, 3), (300, 11, 4), (4096, 12, 2), (20000, 15, 1)])
def test_the_compiled_table_builder_makes_exactly_the_numpy_tables(S, R, K):
    rng = np.random.default_rng(S + R)
    counts = rng.integers(0, 1000, size=(K, S)) * (rng.random((K, S)) < 0.7)
    counts[:, 0] += 1
    freqs = tans.quantize_rows(counts, R)
    compiled = tans.Tables(freqs, R)
    reference = tans.Tables.__new__(tans.Tables)
    reference.K, reference.S, reference.R, reference.L, reference.freqs = K, S, R, 1 << R, freqs
    reference.packed = np.empty(K << R, dtype=np.int64)
    reference._spread_tables()
    assert np.array_equal(compiled.packed, reference.packed)


@pytest.mark.parametrize("interleaved,mode", [(False, "plain"), (True, "plain"), (False, "ctx"),
                                               (True, "ctx"), (False, "dyn")])
def test_both_decode_paths_agree_on_symbols_end_states_and_errors(interleaved, mode):
    rng = np.random.default_rng(7)
    S, K, n, R = 40, 3, 50_001, 10
    sym = np.minimum(rng.geometric(0.2, size=n) - 1, S - 1)
    ctx = rng.integers(0, K, size=n) if mode == "ctx" else None
    dyn = (np.arange(S) % K, 1) if mode == "dyn" else None
    tab = tans.Tables(tans.quantize_rows(np.ones((K, S), dtype=np.int64) + np.bincount(sym, minlength=S), R), R)
    bb = rng.integers(0, 1 << R, size=tans.layout(n, 997, interleaved)[1])
    stream = tans.encode(sym, tab, 997, ctx=ctx, dyn=dyn, bits_back=bb, interleaved=interleaved)

    def decode_good_and_bad():
        out, fin = tans.decode(stream, n, tab, 997, ctx=ctx, dyn=dyn, interleaved=interleaved)
        errors = []
        for bad in (stream[:-1], stream + b"\x00", bytes(len(stream)), stream[:len(stream) // 2]):
            try:
                got = tans.decode(bad, n, tab, 997, ctx=ctx, dyn=dyn, interleaved=interleaved)
                errors.append(("decoded", got[0].tolist(), got[1].tolist()))
            except CodecError as exc:
                errors.append(("error", str(exc)))
        return out.tolist(), fin.tolist(), errors

    results = _through_both_loops(decode_good_and_bad, errors=())
    for _, _, errors in results:
        assert errors[0][0] == errors[1][0] == errors[3][0] == "error"
    assert results[0][0] == sym.tolist() and results[0][1] == bb.tolist()
    assert results[0] == results[1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4000), S=st.sampled_from([2, 5, 16, 200, 256, 300]), K=st.sampled_from([1, 3, 130]),
       lanes=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_sections_agree_on_tails_and_their_errors(n, S, K, lanes, seed):
    # the tails (the last symbols of each lane, coded on the marginal, their low bits in the end
    # states) are handled by _tanstails.c or by numpy: same symbols, same errors on damage
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(0.3, n) - 1, S - 1)
    ctx = rng.integers(0, K, n).astype(np.uint8 if 2 * K <= 255 else np.int64) if K > 1 else None
    sec = entropy.tans_section(sym, S, ctx, K, lanes=min(lanes, n))
    damaged = [sec[:-1], sec + b"\x00", sec[:-1] + bytes([sec[-1] ^ 0x80]), sec[:-2] + bytes([sec[-2] ^ 0x11, sec[-1]])]

    def decode_all():
        out = []
        for s in [sec] + damaged:
            try:
                out.append(entropy.decode_tans_section(s, n, S, ctx, K).tolist())
            except CodecError as exc:
                out.append(str(exc))
        return out
    results = _through_both_loops(decode_all, errors=())
    assert results[0] == results[1]
    assert results[0][0] == sym.tolist()


def test_compiled_tails_merge_end_state_bits_and_refuse_what_no_symbol_owns():
    from lmzfs.codecs import _tansloop as loop
    # n = 9 in 2 interleaved lanes of 5 and 4 steps; k = 2 tails of g = 2 bits each: lane 0's
    # tails are symbols 6 and 8, lane 1's symbols 5 and 7
    sym = np.array([0, 0, 0, 0, 0, 1, 2, 3, 0], dtype=np.uint8)
    ctx = np.zeros(9, dtype=np.uint8)
    loop.tail_contexts(ctx, 9, 5, 2, 2, 3)
    assert ctx.tolist() == [0, 0, 0, 0, 0, 3, 3, 3, 3]
    fin = np.array([0b0110, 0b1001], dtype=np.int64)      # lane 0: bits 2 then 1; lane 1: 1 then 2
    assert loop.tail_symbols(sym, fin, 9, 5, 2, 2, 2, 16) == 0
    assert sym.tolist() == [0, 0, 0, 0, 0, 1 << 2 | 1, 2 << 2 | 2, 3 << 2 | 2, 0 << 2 | 1]
    assert loop.tail_symbols(np.zeros(9, np.uint8), np.array([1 << 4, 0]), 9, 5, 2, 2, 2, 16) == 1
    assert loop.tail_symbols(np.array([0] * 8 + [4], np.uint8), np.zeros(2, np.int64), 9, 5, 2, 2, 2, 16) == 2
    assert loop.tail_symbols(np.array([0] * 8 + [3], np.uint8), np.array([12, 0]), 9, 5, 2, 2, 2, 15) == 2   # 15
    # a lane shorter than k: bits of the tail it does not have must be zero
    assert loop.tail_symbols(np.zeros(5, np.uint8), np.array([0, 0, 1]), 5, 2, 3, 2, 2, 16) == 1   # lane 2: 1 step
    with pytest.raises(ValueError, match="tail_symbols: bad arguments"):
        loop.tail_symbols(np.zeros(9, np.uint8), np.zeros(3, np.int64), 9, 5, 2, 2, 2, 16)
    with pytest.raises(ValueError, match="tail_contexts: bad arguments"):
        loop.tail_contexts(np.zeros(9, np.uint8), 9, 5, 2, 6, 3)     # more tails than steps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_compiled_quantiser_matches_the_numpy_one_exactly(data):
    K = data.draw(st.integers(1, 4))
    S = data.draw(st.integers(1, 300))
    R = data.draw(st.integers(4, 15))
    big = data.draw(st.sampled_from([3, 1000, 1 << 28]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    counts = rng.integers(0, big, size=(K, S)) * (rng.random((K, S)) < data.draw(st.sampled_from([0.05, 0.5, 1.0])))
    counts[:, 0] += 1
    counts[:, :: max(1, S // 7)] *= data.draw(st.sampled_from([1, 2, 1000]))
    results = _through_both_loops(lambda: tans.quantize_rows(counts, R).tolist(), errors=(ValueError,))
    assert results[0] == results[1]


def test_the_compiled_loop_rejects_arguments_that_would_leave_its_buffers():
    from lmzfs.codecs import _tansloop as loop    # whichever path the module's fixture chose
    tab = tans.Tables(tans.quantize_rows(np.array([[5, 3, 1, 7]]), 6), 6)
    vals = np.arange(4, dtype=np.uint8)
    stream = np.zeros(64, dtype=np.uint8)

    def call(states=None, out=None, ctx=None, n=100, T=10, Wp=10, L=64, values=vals, packed=tab.packed):
        states = np.zeros(Wp, dtype=np.int64) if states is None else states
        out = np.empty(n, dtype=np.uint8) if out is None else out
        return loop.decode(packed, packed.dtype == np.uint32, stream, states, out, values, ctx, None, True, n, T,
                           Wp, L, Wp * 6)

    with pytest.raises(ValueError, match="table index"):
        call(states=np.full(10, 64, dtype=np.int64))
    with pytest.raises(ValueError, match="context out of range"):
        call(ctx=np.full(100, 1, dtype=np.uint8))
    with pytest.raises(ValueError, match="context out of range"):
        call(ctx=np.full(100, -1, dtype=np.int64))
    with pytest.raises(ValueError, match="bad decode arguments"):
        call(out=np.empty(99, dtype=np.uint8))
    with pytest.raises(ValueError, match="bad decode arguments"):
        call(T=9)
    with pytest.raises(ValueError, match="has no value"):
        call(values=vals[:2])
    bad = tab.packed.copy()
    bad[0] = 63 | (4 << 16)          # base 63 + 4 bits would leave a table of 64
    with pytest.raises(ValueError, match="leaves its table"):
        call(packed=bad)
    compact = np.full(64, 5 | (1 << 15), dtype=np.uint32)         # base 5, 1 bit: fine
    compact[7] = 63 | (4 << 15)                                     # base 63 + 4 bits leaves a table of 64
    with pytest.raises(ValueError, match="leaves its table"):
        call(packed=compact)
    compact[7] = 5 | (1 << 15) | (4 << 19)                           # symbol 4 of a 4-symbol alphabet
    with pytest.raises(ValueError, match="has no value"):
        call(packed=compact)
    with pytest.raises(ValueError, match="bad table arguments"):
        loop.build(np.array([[8, 0]], dtype=np.int64), 1, 2, 3, np.empty(8, dtype=np.int64))
    with pytest.raises(ValueError, match="unpack_fields: bad arguments"):
        loop.unpack_fields(bytes(4), 11, np.empty(3, dtype=np.int64))   # 33 bits from 32
    u = np.zeros(10, dtype=np.uint16)
    with pytest.raises(ValueError, match="or_plane: bad arguments"):
        loop.or_plane(u, 2, bytes(10), False, 9, None)            # the value would leave its element
    with pytest.raises(ValueError, match="or_plane: bad arguments"):
        loop.or_plane(u, 2, bytes(10), False, 0, bytes(9))        # a mask shorter than the elements
    assert loop.or_plane(u, 2, bytes(11), False, 0, None) == 1    # a plane longer than the elements
    assert loop.or_plane(u, 2, bytes(4), True, 0, None) == 1      # too few nibble pairs
    out8 = bytearray(40)
    assert loop.merge_nibbles(bytes(64), out8, 2, 20, 4, 16) is None   # 2 blocks of 20, 16 quant bytes
    with pytest.raises(ValueError, match="merge_nibbles: bad arguments"):
        loop.merge_nibbles(bytes(63), out8, 2, 20, 4, 16)           # a nibble short
    with pytest.raises(ValueError, match="merge_nibbles: bad arguments"):
        loop.merge_nibbles(bytes(64), bytearray(39), 2, 20, 4, 16)  # blocks past the output
    with pytest.raises(ValueError, match="merge_nibbles: bad arguments"):
        loop.merge_nibbles(bytes(64), out8, 2, 20, 5, 16)           # a field past its block


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=40),
                 st.lists(st.integers(0, 2**35 - 1), max_size=30).map(
                     lambda v: uintlist.pack_uints(np.array(v, dtype=np.int64))[1:])),
       st.integers(0, 12))
def test_compiled_and_numpy_varint_tables_agree_on_values_and_errors(body, count):
    results = _through_both_loops(lambda: uintlist.unpack_uints(b"\x00" + bytes(body), count, "t").tolist())
    assert results[0] == results[1]


@settings(max_examples=200, deadline=None)
@given(st.integers(4, 15), st.integers(1, 300), st.data())
def test_compiled_and_numpy_bits_back_bytes_agree(R, wp, data):
    from lmzfs.codecs import floatsplit
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    fin = rng.integers(0, 1 << R, size=wp)
    m = data.draw(st.integers(0, wp * R // 8))
    if data.draw(st.booleans()):
        fin[(8 * m) // R:] = 0        # often nothing past the stored bytes
    results = _through_both_loops(lambda: floatsplit._bits_back_bytes(fin, R, m).tobytes())
    assert results[0] == results[1]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([np.uint16, np.uint32, np.uint64]), st.integers(1, 300), st.booleans(),
       st.booleans(), st.data())
def test_compiled_and_numpy_plane_merges_agree_on_values_and_errors(dtype, n, nib, masked, data):
    from lmzfs.codecs import floatsplit
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    u0 = rng.integers(0, 256, size=n).astype(dtype)
    mask = rng.random(n) < 0.5 if masked else None
    c = n if mask is None else int(mask.sum())
    v = rng.integers(0, 256, size=(c + 1) // 2 if nib else c).astype(np.uint8)
    if nib and c % 2 and data.draw(st.booleans()):
        v[-1] &= 15                   # often a clean padding nibble; otherwise an error
    shift = 8 * data.draw(st.integers(0, np.dtype(dtype).itemsize - 1))

    def merge():
        u = u0.copy()
        floatsplit._or_plane(u, v, c, nib, shift, mask)
        return u.tobytes()
    results = _through_both_loops(merge)
    assert results[0] == results[1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6000), lanes=st.integers(1, 700), S=st.integers(1, 300),
       dtype=st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]),
       mode=st.sampled_from(["plain", "dyn", "interleaved", "interleaved ctx"]), seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_decodes_agree_on_mapped_values_of_every_width(n, lanes, S, dtype, mode, seed):
    # 16-bit values take the compiled loop's transposing path (8 x 8 blocks); the others map
    # symbols while scattering; with interleaved lanes 8- and 16-bit values are stored in place:
    # all must give what the numpy loop gives
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(0.05, n) - 1, S - 1)
    R = 11
    K = 1 if mode in ("plain", "interleaved") else 2
    freqs = np.stack([tans.quantize(np.bincount(sym, minlength=S) + 1, R) for _ in range(K)])
    tab = tans.Tables(freqs, R)
    kw: dict = {"dyn": (rng.integers(0, K, S), 0)} if mode == "dyn" else {}
    if mode == "interleaved ctx":
        kw["ctx"] = rng.integers(0, K, n).astype(np.uint8)
    il = mode.startswith("interleaved")
    stream = tans.encode(sym, tab, lanes, interleaved=il, **kw)
    values = rng.integers(0, np.iinfo(dtype).max, size=S, dtype=np.uint64).astype(dtype)
    results = _through_both_loops(
        lambda: [a.tobytes() for a in tans.decode(stream, n, tab, lanes, interleaved=il, values=values, **kw)])
    assert results[0] == results[1]
    assert results[0][0] == values[sym].tobytes()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(LAYOUTS)), st.integers(0, 40), st.integers(0, 7), st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_nibble_merges_agree_and_touch_only_the_field(layout, nblk, tail, seed):
    from lmzfs.codecs import ggufblocks
    _, bsize, fields = LAYOUTS[layout]
    foff, fsize = next((off, size) for off, size, kind in fields if kind == "q")
    rng = np.random.default_rng(seed)
    nib = rng.integers(0, 16, 2 * fsize * nblk).astype(np.uint8)
    before = rng.integers(0, 256, nblk * bsize + tail).astype(np.uint8)

    def merge():
        out = before.copy()
        ggufblocks._merge_nibbles(out, nib, nblk, bsize, foff, fsize)
        return out.tobytes()
    results = _through_both_loops(merge)
    assert results[0] == results[1]
    want = before.copy()
    if nblk:
        want[: nblk * bsize].reshape(nblk, bsize)[:, foff:foff + fsize] = \
            (nib[0::2] | (nib[1::2] << 4)).reshape(nblk, fsize)
    assert results[0] == want.tobytes()


SPECIAL_HALVES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0x7C00, 0xFC00,
                  0x7E00, 0x7C01, 0xFE01, 0x3800, 0x4B80, 0x4B00, 0xCB80]   # zeros, subnormals, inf, nan, halves


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.integers(0, 0xFFFF), st.sampled_from(SPECIAL_HALVES)),
                          st.one_of(st.integers(0, 0xFFFF), st.sampled_from(SPECIAL_HALVES))), max_size=300))
def test_compiled_and_numpy_q4_1_zero_points_agree_for_every_half(pairs):
    from lmzfs.codecs import ggufblocks
    blocks = np.zeros((len(pairs), 20), dtype=np.uint8)
    if pairs:
        blocks[:, 0:4] = np.array(pairs, dtype="<u2").view(np.uint8).reshape(-1, 4)
    results = _through_both_loops(lambda: ggufblocks._q4_1_contexts(blocks).tobytes())
    assert results[0] == results[1]
    want = []
    with np.errstate(all="ignore"):
        for d, m in np.array(pairs, dtype="<u2").reshape(-1, 2).view("<f2"):
            z = -np.float32(m) / np.float32(d)          # float32 arithmetic, as the format says
            want.append(int(min(15, max(0, np.rint(z)))) if np.isfinite(z) else 0)
    assert results[0] == bytes(np.repeat(np.array(want, dtype=np.uint8), 32))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 15), st.lists(st.integers(0, 2**15 - 1), min_size=1, max_size=400))
def test_compiled_fields_unpack_what_was_packed(R, values):
    from lmzfs.codecs import _tansloop as loop
    v = np.array(values, dtype=np.int64) & ((1 << R) - 1)
    packed = loop.pack_fields(v, R, (len(v) * R + 7) // 8)
    out = np.empty(len(v), dtype=np.int64)
    loop.unpack_fields(packed, R, out)
    assert out.tolist() == v.tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 12), st.sampled_from([4, 8, 16]), st.integers(4, 12), st.data())
def test_compiled_and_numpy_floatsplit_model_tables_agree_on_entries_and_errors(nb, E, T2, R, data):
    from lmzfs.codecs import floatsplit
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A = rng.integers(0, 1 << floatsplit.A_LOG, size=(nb, E)) * (rng.random((nb, E)) < 0.7)
    if data.draw(st.booleans()):
        A[rng.integers(0, nb)] = 0                      # an unused context
    SM = rng.integers(0, (1 << floatsplit.M_LOG) + 1, size=2 + E * T2 // 2) * (rng.random(2 + E * T2 // 2) < 0.8)
    vals = np.concatenate([A.ravel(), SM]).astype(np.int64)
    if data.draw(st.integers(0, 9)) == 0:
        vals[rng.integers(0, len(vals))] = (1 << floatsplit.A_LOG) + 1   # out of range
    def entries(tab: tans.Tables) -> list[int]:     # the numpy loop's entry form either way
        if tab.packed32 is None:
            return tab.packed.tolist()
        e = tab.packed32.astype(np.int64)
        return ((e & 0x7FFF) | (((e >> 15) & 15) << 16) | ((e >> 19) << 20)).tolist()

    results = _through_both_loops(lambda: entries(floatsplit._model_tables(vals, nb, E, T2, R)))
    assert results[0] == results[1]
