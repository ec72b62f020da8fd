"""blockdelta (codec 9), GGUF blocks coded field by field against a reference chunk, through the
public seams: exact round trips for every block layout, the compiled and numpy paths agreeing,
hostile payloads refused, and encode_delta_chunk keeping it only where it is the smallest."""
from __future__ import annotations

import numpy as np
import pytest

from lmzfs.codecs import CodecError, ChunkHint, decode_chunk, encode_delta_chunk, encode_delta_with, kernels, parse_payload
from lmzfs.codecs.base import put_varint
from lmzfs.codecs.ggufblocks import LAYOUTS


def _release_pair(t: int, nblk: int, seed: int = 0) -> tuple[bytes, bytes]:
    """Random blocks of type t, and the same blocks with fp16 fields scaled a little and every
    byte (both nibbles of packed quants) moved by at most one step."""
    rng = np.random.default_rng(seed + t)
    _, bsize, fields = LAYOUTS[t]
    ref = rng.integers(0, 256, (nblk, bsize), dtype=np.uint8)
    new = ref.copy()
    for off, size, kind in fields:
        if kind == "f16":
            h = (rng.random((nblk, size // 2)) * 0.02).astype(np.float16)
            ref[:, off:off + size] = h.view(np.uint8).reshape(nblk, size)
            new[:, off:off + size] = (h * np.float16(1.001)).view(np.uint8).reshape(nblk, size)
        else:
            lo = np.clip((ref[:, off:off + size] & 15).astype(np.int16) + rng.integers(-1, 2, (nblk, size)), 0, 15)
            hi = np.clip((ref[:, off:off + size] >> 4).astype(np.int16) + rng.integers(-1, 2, (nblk, size)), 0, 15)
            new[:, off:off + size] = (lo | (hi << 4)).astype(np.uint8)
    return new.tobytes(), ref.tobytes()


def _hint(t: int) -> ChunkHint:
    name, bsize, _ = LAYOUTS[t]
    return ChunkHint(name, 0, bsize)


@pytest.mark.parametrize("t", sorted(LAYOUTS))
def test_blockdelta_round_trips_every_block_layout_with_trailing_bytes_and_random_pairs(t):
    new, ref = _release_pair(t, 300)
    rng = np.random.default_rng(t)
    cases = [(new, ref), (new + b"\x05\x06", ref + b"\x60\x50"), (b"", b""), (b"\x01", b"\x02"),
             (rng.integers(0, 256, len(new), dtype=np.uint8).tobytes(), ref), (ref, ref)]
    for data, reference in cases:
        payload = encode_delta_with("blockdelta", data, reference, _hint(t))
        assert parse_payload(payload).codec_id == 9
        assert decode_chunk(payload, len(data), ref=reference) == data


@pytest.mark.parametrize("t", [3, 8, 12, 14])
def test_the_compiled_and_numpy_paths_write_identical_blockdelta_payloads_and_decode_identical_bytes(t):
    if kernels.compiled() is None:
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; `pip install -e .` builds it")
    new, ref = _release_pair(t, 200, seed=4)
    compiled = encode_delta_with("blockdelta", new, ref, _hint(t))
    out_compiled = decode_chunk(compiled, len(new), ref=ref)
    with kernels.reference_only():
        numpy_payload = encode_delta_with("blockdelta", new, ref, _hint(t))
        out_numpy = decode_chunk(compiled, len(new), ref=ref)
    assert compiled == numpy_payload
    assert out_compiled == out_numpy == new


def test_q4_1_releases_code_smaller_field_by_field_than_as_bytes_or_xor_and_the_smallest_is_kept():
    new, ref = _release_pair(3, 2000, seed=1)
    sizes = {c: len(encode_delta_with(c, new, ref, _hint(3))) for c in ("blockdelta", "xorzstd")}
    as_bytes = len(encode_delta_with("ulpdelta", new, ref, ChunkHint("U8", 1)))
    assert sizes["blockdelta"] < as_bytes < sizes["xorzstd"]
    best = encode_delta_chunk(new, ref, _hint(3))
    assert best.codec == "blockdelta" and len(best.payload) == sizes["blockdelta"]


def test_blockdelta_does_not_code_dtypes_without_a_block_layout():
    for hint in (ChunkHint("BF16", 2), ChunkHint("I8", 1), ChunkHint(), ChunkHint("IQ4_XS", 0, 136)):
        with pytest.raises(ValueError, match="does not code"):
            encode_delta_with("blockdelta", bytes(272), bytes(272), hint)


def _payload(size: int, params: bytes, body: bytes) -> bytes:
    return b"LC\x01\x09" + put_varint(size) + put_varint(len(params)) + params + body


def test_hostile_blockdelta_payloads_are_refused_with_codec_errors():
    new, ref = _release_pair(3, 500, seed=2)
    payload = encode_delta_with("blockdelta", new, ref, _hint(3))
    h = parse_payload(payload)
    params, body, n = bytes(h.params), bytes(h.body), len(new)
    hostile = {
        "truncated body": payload[:-1],
        "longer body": payload + b"\x00",
        "unknown type": _payload(n, b"\x63" + params[1:], body),
        "params cut short": _payload(n, params[:3], body),
        "params cut inside a stream": _payload(n, params[:-2], body),
        "params longer than their streams": _payload(n, params + b"\x00", body),
        "a stream's params length past the end": _payload(n, params[:5] + put_varint(1 << 20) + params[6:], body),
        "a body bit flipped": payload[:-len(body) // 2] + bytes((payload[-len(body) // 2] ^ 4,)) + payload[-len(body) // 2 + 1:],
    }
    for what, bad in hostile.items():
        with pytest.raises(CodecError):
            decode_chunk(bad, n, ref=ref)
            pytest.fail(what)
    with pytest.raises(CodecError, match="reference holds"):
        decode_chunk(payload, n, ref=ref[:-20])


def test_a_quant_stream_decoding_to_values_above_15_is_refused():
    # a Q4_0 chunk whose quant stream is a ulpdelta stream of bytes that are not 4-bit quants
    t = 2
    ref = bytes(18 * 4)
    new, _ = _release_pair(t, 4)
    honest = parse_payload(encode_delta_with("blockdelta", new, ref, _hint(t))).params
    scale_stream = encode_delta_with("ulpdelta", bytes(8), bytes(8), ChunkHint("F16", 2))
    wide = encode_delta_with("ulpdelta", bytes(range(100, 228)), bytes(128), ChunkHint("U8", 1))
    parts = []
    for s in (scale_stream, wide):
        sh = parse_payload(s)
        parts.append((bytes(sh.params), bytes(sh.body)))
    params = bytes(honest[:5]) + b"".join(put_varint(len(p)) + p + put_varint(len(b)) for p, b in parts)
    with pytest.raises(CodecError, match="above 15"):
        decode_chunk(_payload(len(ref), params, b"".join(b for _, b in parts)), len(ref), ref=ref)
