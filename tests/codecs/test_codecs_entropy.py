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
from lmzfs.codecs import entropy, kernels, tans
from lmzfs.codecs.base import put_varint
from lmzfs.codecs.floatsplit import FORMATS
from lmzfs.codecs.ggufblocks import LAYOUTS
from lmzfs.testing import hostile
from lmzfs.testing.tanspaths import compiled_then_numpy, value_or_error


@pytest.fixture(scope="module", autouse=True)
def _both_tans_paths(tans_loop):
    """Every test here runs once through the compiled tANS loop and once through numpy."""
    return tans_loop

FIXTURES = Path(__file__).parent.parent / "fixtures" / "codecs"
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
    enc = encode_chunk(data, hint, segments=False)
    assert enc.codec == "floatsplit"
    assert len(enc.payload) < len(encode_with("bytegroup", data, hint))


def test_encode_chunk_picks_ggufblocks_for_q4_1_and_entropy_for_int8():
    data = q4_1_blocks(5000, 1)
    enc = encode_chunk(data, ChunkHint("Q4_1", 0, 20))
    assert enc.codec == "ggufblocks" and len(enc.payload) < len(encode_with("zstd", data))
    i8 = np.clip(np.rint(np.random.default_rng(2).laplace(0, 3, 200_000)), -128, 127).astype(np.int8).tobytes()
    enc = encode_chunk(i8, ChunkHint("I8", 1))
    assert enc.codec == "entropy" and len(enc.payload) < len(encode_with("zstd", i8))


def skewed_bytes(low_weight: float, n: int = 65536) -> np.ndarray:
    """n bytes, each of the 128 low values low_weight times as likely as each high one."""
    p = np.where(np.arange(256) < 128, low_weight, 1.0)
    return np.random.default_rng(7).choice(256, size=n, p=p / p.sum()).astype(np.uint8)


@pytest.mark.parametrize("exhaustive", [False, True])
def test_a_stream_that_codes_less_than_a_sixty_fourth_smaller_than_stored_is_stored(exhaustive):
    a = skewed_bytes(2.5)            # tANS codes it 1.5% smaller: not worth a tANS decode
    stored = bytes((entropy.RAW,)) + a.tobytes()
    assert len(stored) > 1 + len(entropy.tans_section(a, 256)) >= entropy.worth_coding(len(stored))
    assert entropy.encode_stream(a, exhaustive=exhaustive) == stored


@pytest.mark.parametrize("exhaustive", [False, True])
def test_a_stream_that_codes_a_sixty_fourth_or_more_smaller_than_stored_is_coded(exhaustive):
    a = skewed_bytes(3.0)            # tANS codes it 2.1% smaller
    coded = entropy.encode_stream(a, exhaustive=exhaustive)
    assert coded[0] == entropy.TANS and len(coded) < entropy.worth_coding(len(a) + 1)
    assert np.array_equal(entropy.decode_stream(coded, len(a)), a)


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


@pytest.mark.parametrize("shape", [(4000, 1), (1500, 48), (700, 96)])
def test_every_flipped_byte_of_an_entropy_payload_gives_the_compiled_and_numpy_paths_the_same_outcome(shape):
    if kernels.compiled() is None:
        pytest.skip("compares the compiled path with the numpy one")
    data = int8_columns(*shape, seed=shape[1])
    payload = encode_with("entropy", data, ChunkHint("I8", 1, shape=shape))
    assert compiled_then_numpy(lambda: decode_chunk(payload, len(data))) == (data, data)
    step = max(1, len(payload) // 400)
    for at in sorted(set(range(0, min(len(payload), 160))) | set(range(0, len(payload), step))):
        bad = bytearray(payload)
        bad[at] ^= 0x11
        compiled, reference = compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk(bytes(bad), len(data))))
        assert compiled == reference, at
