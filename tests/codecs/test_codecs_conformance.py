"""What every registered codec must do, checked over ``REGISTRY`` so that a new codec is covered
as soon as it is registered (after numcodecs' shared codec checks).

A codec is tried under every hint of HINTS that it codes: a delta codec where encode_delta does
not return None, any other where encode does not refuse the hint with a ValueError. Under each:

* adversarial inputs round trip exactly: empty, one byte, lengths that are not a whole number of
  elements or blocks, all zeros, all 0xFF, random bytes, a long run, weight-like values, and for
  float hints NaNs, infinities, negative zeros and subnormals; a delta codec's against several
  references (the chunk itself, a close one, an unrelated one, zeros);
* a payload cut short, with bytes after it, or with any header byte changed raises CodecError;
  a changed body byte raises CodecError or decodes to bytes of the right size (raw, zstd,
  bytegroup and xorzstd keep no checksum of their own: the store's chunk hash catches those),
  and raises CodecError under the codecs in CHECKSUMMED;
* the compiled kernels give the numpy reference's payloads and decoded bytes, errors included.
"""
from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import (
    REGISTRY, STRINGS_DTYPE, ChunkHint, Codec, CodecError, decode_chunk, encode_chunk, encode_delta_with,
    encode_with, kernels, parse_payload,
)
from lmzfs.testing.tanspaths import compiled_then_numpy, value_or_error

HINTS = [
    ChunkHint(), ChunkHint("X", 2), ChunkHint("X", 4), ChunkHint("X", 8),
    ChunkHint("I8", 1), ChunkHint("U8", 1), ChunkHint("I32", 4), ChunkHint("I64", 8),
    ChunkHint("F16", 2), ChunkHint("BF16", 2), ChunkHint("F32", 4), ChunkHint("F64", 8),
    ChunkHint("F8_E4M3", 1), ChunkHint("F8_E5M2", 1),
    ChunkHint("BF16", 2, shape=(24, 40)), ChunkHint("F32", 4, shape=(64, 12), offset=96),
    ChunkHint("I8", 1, shape=(80, 48)),
    ChunkHint("Q4_0", 0, 18), ChunkHint("Q4_1", 0, 20), ChunkHint("Q8_0", 0, 34), ChunkHint("Q4_K", 0, 144),
    ChunkHint(STRINGS_DTYPE),
]
# Codecs that check their plain bytes against a CRC-32 of their own: a changed body byte raises.
CHECKSUMMED = {"floatsplit", "entropy", "ggufblocks", "floatseg", "ulpdelta", "blockdelta", "strings"}
# Special float bit patterns: +-0, +-inf, quiet and signalling NaNs with payloads, subnormals, max.
SPECIAL = {
    2: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE5A, 0x0001, 0x83FF, 0x7BFF,
        0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFAB, 0x0080, 0x007F, 0x7F7F],
    4: [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345,
        0x00000001, 0x807FFFFF, 0x7F7FFFFF],
    8: [0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
        0x7FF0000000000001, 0xFFF8DEADBEEF0001, 1, 0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF],
}
UINT = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def _probe(hint: ChunkHint) -> bytes:
    """What decides whether a codec codes a hint: a few KiB of weight-like elements."""
    return _weights(hint, 4096, seed=1)


def _encode(codec: Codec, data: bytes, hint: ChunkHint, ref: bytes | None = None) -> bytes:
    if codec.reference:
        return encode_delta_with(codec, data, data if ref is None else ref, hint)
    return encode_with(codec, data, hint)


def _codes(codec: Codec, hint: ChunkHint) -> bool:
    data = _probe(hint)
    if codec.reference:
        return codec.encode_delta(memoryview(data), memoryview(data), hint) is not None
    try:
        codec.encode(memoryview(data), hint)
    except CodecError:      # a ValueError too, but never an encoder's refusal
        raise
    except ValueError:
        return False
    return True


def _hint_id(hint: ChunkHint) -> str:
    return f"{hint.dtype or 'untyped'}{hint.itemsize if hint.dtype == 'X' else ''}{'-shaped' if hint.shape else ''}"


@pytest.fixture(autouse=True)
def _small_floatseg_segments(small_segments):
    """floatseg cuts these inputs into several segments (4 KiB each) rather than one."""
    return small_segments


def _unit(hint: ChunkHint) -> int:
    return max(1, hint.itemsize, hint.block_bytes)


def _weights(hint: ChunkHint, nbytes: int, seed: int) -> bytes:
    """Trained-weight-like values in the hint's element type, nbytes of them (cut to length)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 0.02, nbytes // 2 + 8).astype(np.float32)
    dtype = (hint.dtype or "").upper()
    if dtype in ("F16", "F64"):
        raw = w.astype("<f2" if dtype == "F16" else "<f8").tobytes()
    elif dtype == "BF16":
        raw = (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    elif hint.itemsize == 1 or hint.block_bytes:
        raw = np.clip(np.rint(w * 3000), -127, 127).astype(np.int8).tobytes()
    else:
        raw = w.tobytes()
    return (raw * (nbytes // max(1, len(raw)) + 1))[:nbytes]


def _specials(hint: ChunkHint, count: int, seed: int) -> bytes:
    """Elements drawn from the special bit patterns of the hint's float width (all 256 bytes
    for 8-bit floats), mixed with ordinary values."""
    k = hint.itemsize
    rng = np.random.default_rng(seed)
    pool = np.arange(256) if k == 1 else np.array(SPECIAL[k], dtype=np.uint64)
    picked = pool[rng.integers(0, len(pool), count)].astype(UINT[k])
    ordinary = np.frombuffer(_weights(hint, count * k, seed), dtype=UINT[k])
    return np.where(rng.random(count) < 0.5, picked, ordinary).astype(UINT[k]).tobytes()


CODECS = list(REGISTRY.values())
CASES = [(c, h) for c in CODECS for h in HINTS if _codes(c, h)]
CASE_IDS = [f"{c.name}-{_hint_id(h)}" for c, h in CASES]


def adversarial_inputs(hint: ChunkHint) -> list[tuple[str, bytes]]:
    """(name, plain bytes) of the inputs every codec must round trip under the hint."""
    unit = _unit(hint)
    rng = np.random.default_rng(unit)
    out = [("empty", b""), ("one byte", b"\x5a"),
           ("all zeros", bytes(64 * unit)), ("all 0xFF", b"\xff" * (64 * unit)),
           ("random", rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()),
           ("random, long", rng.integers(0, 256, 20000 + 7, dtype=np.uint8).tobytes()),
           ("weights", _weights(hint, 200 * unit, seed=2)),
           ("weights, long", _weights(hint, 30000, seed=3)),
           ("a long run", _weights(hint, unit, seed=4) * (60000 // unit) + b"\x01")]
    for tail in sorted({1, unit - 1, unit // 2} - {0, unit}):
        out.append((f"{tail} bytes past whole elements", _weights(hint, 100 * unit + tail, seed=5 + tail)))
    if (hint.dtype or "").upper().startswith(("F16", "BF16", "F32", "F64", "F8")):
        out.append(("NaN, inf and -0 patterns", _specials(hint, 700, seed=6)))
        out.append(("NaN, inf and -0 patterns past whole elements", _specials(hint, 300, seed=7) + b"\x80"))
    if hint.dtype == STRINGS_DTYPE:
        strings = [b"", b"a", "\u00e9t\u00e9".encode(), b"\x00" * 9, b"token" * 40] * 20
        out.append(("a run of strings", b"".join(struct.pack("<Q", len(t)) + t for t in strings) + b"\x07\x00"))
    return out


def references(data: bytes) -> list[tuple[str, bytes]]:
    """(name, reference) a delta codec codes data against: itself, a close one, a far one, zeros."""
    rng = np.random.default_rng(len(data))
    close = bytearray(data)
    for i in rng.integers(0, max(1, len(data)), min(len(data), 1 + len(data) // 50)):
        close[i] ^= 1 << int(rng.integers(0, 8))
    far = rng.integers(0, 256, len(data), dtype=np.uint8).tobytes()
    return [("itself", data), ("close", bytes(close)), ("unrelated", far), ("zeros", bytes(len(data)))]


def _round_trips(codec: Codec, hint: ChunkHint, name: str, data: bytes) -> None:
    refs = references(data) if codec.reference else [("", None)]
    for rname, ref in refs:
        try:
            payload = _encode(codec, data, hint, ref)
        except CodecError:
            raise
        except ValueError:
            # only a chunk without one whole element (or block) may be refused, as floatseg does
            assert len(data) < _unit(hint), f"{codec.name} refused {name} ({len(data)} bytes)"
            continue
        assert REGISTRY[parse_payload(payload).codec_id] is codec
        got = decode_chunk(payload, len(data), ref=ref)
        assert got == data, f"{codec.name}: {name} {rname} did not round trip"
        assert decode_chunk(payload, len(data), ref=ref, hash_checked=True) == data


def test_every_registered_codec_codes_some_hint_here():
    """Else the checks below would pass it by trying nothing: add a hint it codes to HINTS."""
    assert {c.name for c, _ in CASES} == {c.name for c in CODECS}


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_adversarial_inputs_round_trip_exactly(codec, hint):
    for name, data in adversarial_inputs(hint):
        _round_trips(codec, hint, name, data)


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_zero_length_and_sub_element_chunks_round_trip_under_every_codec(codec, hint):
    """Every length from 0 to just past one element (or block), under the codec and under
    encode_chunk's choice (once tests/codecs/test_codecs.py's, there for raw, zstd and bytegroup only),
    through the compiled kernels and the numpy reference."""
    for path in (contextlib.nullcontext, kernels.reference_only):
        with path():
            for n in range(0, _unit(hint) + 2):
                data = bytes(range(7, 7 + n))
                _round_trips(codec, hint, f"{n} bytes", data)
                if not codec.reference:
                    assert decode_chunk(encode_chunk(data, hint).payload, n) == data


quick = settings(deadline=None, max_examples=250, suppress_health_check=[HealthCheck.too_slow])


@quick
@given(case=st.sampled_from(CASES), data=st.one_of(
    st.binary(max_size=3000),
    st.tuples(st.binary(min_size=1, max_size=40), st.integers(1, 200), st.binary(max_size=9))
      .map(lambda t: t[0] * t[1] + t[2])))
def test_arbitrary_bytes_round_trip_under_every_codec_and_hint(case, data):
    codec, hint = case
    _round_trips(codec, hint, "arbitrary bytes", data)


# --- damaged payloads -------------------------------------------------------------------------

def _damage_cases(hint: ChunkHint) -> list[tuple[str, bytes]]:
    unit = _unit(hint)
    return [("one element", _weights(hint, unit, seed=9)), ("weights", _weights(hint, 300 * unit + (unit > 1), seed=8))]


def _header_length(payload: bytes) -> int:
    h = parse_payload(payload)
    return len(payload) - len(h.body) - len(h.params)


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_a_payload_cut_short_or_with_bytes_after_it_raises(codec, hint):
    for name, data in _damage_cases(hint):
        ref = references(data)[1][1] if codec.reference else None
        payload = _encode(codec, data, hint, ref)
        cuts = sorted({*range(min(len(payload), 80)), len(payload) // 2, *range(max(0, len(payload) - 40), len(payload))})
        for n in cuts:
            for hash_checked in (False, True):
                with pytest.raises(CodecError):
                    decode_chunk(payload[:n], len(data), ref=ref, hash_checked=hash_checked)
        for extra in (b"\x00", b"\xff", payload):
            with pytest.raises(CodecError):
                decode_chunk(payload + extra, len(data), ref=ref)


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_any_changed_header_byte_raises(codec, hint):
    for name, data in _damage_cases(hint):
        ref = references(data)[1][1] if codec.reference else None
        payload = _encode(codec, data, hint, ref)
        for i in range(_header_length(payload)):
            for mask in (0xFF, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80):
                bad = bytearray(payload)
                bad[i] ^= mask
                with pytest.raises(CodecError):
                    decode_chunk(bytes(bad), len(data), ref=ref)


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_a_changed_body_byte_raises_or_decodes_to_the_right_size(codec, hint):
    """Never another exception, never another size; under CHECKSUMMED codecs always CodecError
    (while the codec checks its CRC: hash_checked=False)."""
    _, data = _damage_cases(hint)[1]
    ref = references(data)[1][1] if codec.reference else None
    payload = _encode(codec, data, hint, ref)
    head = _header_length(payload)
    step = max(1, (len(payload) - head) // 300)
    for i in range(head, len(payload), step):
        for mask in (0xFF, 0x01, 0x80):
            bad = bytearray(payload)
            bad[i] ^= mask
            try:
                out = decode_chunk(bytes(bad), len(data), ref=ref)
            except CodecError:
                continue
            assert len(out) == len(data), f"{codec.name}: a flip at byte {i} decoded to {len(out)} bytes"
            assert codec.name not in CHECKSUMMED or out == data, \
                f"{codec.name}: a flip {mask:#x} at byte {i} returned wrong bytes"


# --- compiled kernels against the numpy reference ----------------------------------------------

def _refusal_or(compute):
    """compute()'s result, or the message of the ValueError it raised."""
    try:
        return compute()
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("codec, hint", CASES, ids=CASE_IDS)
def test_the_compiled_kernels_write_and_read_the_numpy_references_payloads(codec, hint):
    if kernels.built() is None:
        pytest.skip("the compiled kernels (lmzfs/codecs/_tansloop.c) are not built: nothing to compare")
    for name, data in adversarial_inputs(hint):
        ref = references(data)[1][1] if codec.reference else None
        compiled, reference = compiled_then_numpy(lambda: _refusal_or(lambda: _encode(codec, data, hint, ref)))
        assert compiled == reference, f"{codec.name}: {name} coded differently by the compiled kernels"
        if isinstance(compiled, str):
            continue            # refused alike on both paths (a chunk without a whole element)
        outcomes = compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk(compiled, len(data), ref=ref)))
        assert outcomes == (data, data), f"{codec.name}: {name}"
        if name != "weights":
            continue
        # a damaged payload: the same bytes or the same error on both paths
        for i in range(0, len(compiled), max(1, len(compiled) // 60)):
            bad = bytearray(compiled)
            bad[i] ^= 0x5A
            got = compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk(bytes(bad), len(data), ref=ref)))
            assert got[0] == got[1], f"{codec.name}: {name}, byte {i} changed: the two paths disagree"
