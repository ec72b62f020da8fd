"""strings (codec 10): runs of length-prefixed strings (GGUF tokenizer arrays) round-trip exactly,
whatever the chunk holds; the compiled parse and join agree with the numpy ones; damaged
payloads are refused; a GGUF's tokenizer is stored smaller than zstd's slow level stores it."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.chunker import plan_chunks
from lmzfs.codecs import ChunkHint, CodecError, decode_chunk, encode_chunk, encode_with, kernels, parse_payload
from lmzfs.codecs.base import put_varint
from lmzfs.codecs.strings import DTYPE, join_strings, split_strings
from lmzfs.formats import parse_file
from lmzfs.testing.tanspaths import compiled_then_numpy, value_or_error

HINT = ChunkHint(DTYPE)


@pytest.fixture(scope="module", autouse=True)
def _both_tans_paths(tans_loop):
    """Every test here runs with the compiled module and with numpy only."""
    return tans_loop


def both_paths(compute):
    """(compiled, numpy) results; the module's numpy variant has no compiled path to compare."""
    if kernels.compiled() is None:
        pytest.skip("compares the compiled path with the numpy one")
    return compiled_then_numpy(compute)


def run_of(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in strings)


def round_trip(data: bytes) -> bytes:
    payload = encode_with("strings", data, HINT)
    assert parse_payload(payload).codec_id == 10
    return decode_chunk(payload, len(data))


def test_a_run_of_strings_with_empty_and_multibyte_ones_round_trips():
    data = run_of([b"hello", b"", "\u0120world".encode(), b"\x00" * 9, "\U0001f600".encode()] * 50)
    assert round_trip(data) == data


def test_a_string_cut_off_by_the_chunk_end_is_kept_as_tail_bytes():
    data = run_of([b"abc", b"defg"]) + struct.pack("<Q", 100) + b"only twelve."
    assert split_strings(data)[0].tolist() == [3, 4]
    assert round_trip(data) == data


@pytest.mark.parametrize("data", [b"", b"\x01", b"1234567", struct.pack("<Q", 2**64 - 1) + b"x" * 40,
                                  bytes(range(256)) * 3, b"\x00" * 64])
def test_chunks_that_are_not_runs_of_strings_round_trip_too(data):
    assert round_trip(data) == data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40), max_size=60), st.binary(max_size=30))
def test_any_strings_followed_by_any_bytes_round_trip(strings, tail):
    data = run_of(strings) + tail
    assert round_trip(data) == data


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=40), st.binary(max_size=20))
def test_the_compiled_parse_and_join_agree_with_numpy(strings, tail):
    data = run_of(strings) + tail
    (lc, ec), (ln, en) = both_paths(lambda: split_strings(data))
    assert lc.tolist() == ln.tolist() and ec == en
    assert lc.tolist()[:len(strings)] == [len(s) for s in strings][:len(lc)]
    text = b"".join(strings) + tail
    joined = both_paths(lambda: join_strings(np.array([len(s) for s in strings], dtype=np.int64),
                                                      text, 8 * len(strings) + len(text)).tobytes())
    assert joined[0] == joined[1] == data


def test_lengths_that_do_not_fit_the_text_are_refused_on_both_paths():
    for lengths, text, size in (([5], b"abcd", 12), ([2, 2], b"abc", 19), ([-1], b"abc", 11), ([1], b"ab", 11)):
        got = both_paths(lambda: value_or_error(
            lambda: join_strings(np.array(lengths, dtype=np.int64), text, size).tobytes()))
        assert got[0] == got[1] == "CodecError: strings: the lengths and the text do not make the chunk"


def test_damaged_payloads_are_refused():
    data = run_of([b"token%d" % i for i in range(400)])
    payload = bytearray(encode_with("strings", data, HINT))
    h = parse_payload(bytes(payload))
    params_at = len(payload) - len(h.body) - len(h.params)
    with pytest.raises(CodecError):
        decode_chunk(bytes(payload[:-1]), len(data))
    with pytest.raises(CodecError):
        decode_chunk(bytes(payload), len(data) + 1)
    flipped = bytearray(payload)
    flipped[params_at] ^= 1                         # the CRC
    with pytest.raises(CodecError, match="CRC"):
        decode_chunk(bytes(flipped), len(data))
    assert decode_chunk(bytes(flipped), len(data), hash_checked=True) == data
    # a string count past what the chunk could hold, or more length bytes than strings allow
    for count, nv in ((len(data), 400), (400, 2001), (400, 399)):
        params = bytes(h.params[:4]) + put_varint(count) + put_varint(nv) + bytes(h.params[4 + 2 + 2:])
        forged = payload[:4] + put_varint(len(data)) + put_varint(len(params)) + params + bytes(h.body)
        with pytest.raises(CodecError):
            decode_chunk(bytes(forged), len(data))


def test_a_gguf_tokenizer_is_cut_at_string_starts_and_stored_smaller_than_zstd_19(smollm2_path):
    layout = parse_file(smollm2_path)
    plans = [c for c in plan_chunks(layout) if c.hint.dtype == DTYPE]
    assert len(plans) >= 2
    ours = zstd19 = 0
    with open(smollm2_path, "rb") as f:
        for c in plans:
            data = os.pread(f.fileno(), c.length, c.offset)
            lengths, end = split_strings(data)
            assert end == len(data) and len(lengths) > 1000          # whole strings, no tail
            e = encode_chunk(data, c.hint)
            assert e.codec == "strings" and decode_chunk(e.payload, len(data)) == data
            ours += len(e.payload)
            zstd19 += len(zstandard.ZstdCompressor(level=19).compress(data))
    assert ours < 0.93 * zstd19
