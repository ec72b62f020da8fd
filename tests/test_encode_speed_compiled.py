"""The compiled encoder passes (lmzfs/codecs/_tansfit.c) against the numpy code they stand in for:
the same payload bytes, on adversarial chunks (constant, all-NaN, random, tiny, odd sizes, rows
of very different scale), and payloads that both decode paths give back exactly."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import decode_chunk, encode_with, entropy, floatsplit, tans
from lmzfs.codecs.base import ChunkHint
from lmzfs.testing.tanspaths import compiled_then_numpy


@pytest.fixture(autouse=True)
def _compiled_loop_built():
    if tans._loop is None:
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; `pip install -e .` builds it")


def _decodes_back_both_ways(payload: bytes, data: bytes) -> None:
    got = compiled_then_numpy(lambda: decode_chunk(payload, len(data)))
    assert got == (data, data)


_FLOATS = {"BF16": ("<u2", 2), "F16": ("<u2", 2), "F32": ("<u4", 4)}


def _float_chunk(kind: str, dtype: str, n: int, C: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    utype, width = _FLOATS[dtype]
    if kind == "constant":
        return rng.integers(0, 256, width, dtype=np.uint8).tobytes() * n
    if kind == "nan":
        v = np.full(n, np.nan, dtype=np.float32)
    elif kind == "random":
        return rng.integers(0, 256, n * width, dtype=np.uint8).tobytes()
    else:   # weights, every few rows far larger: the row classes pay
        v = rng.normal(0, 0.02, n).astype(np.float32)
        rows = np.arange(n) // max(C, 1)
        v[rows % 3 == 0] *= 3000
    if dtype == "BF16":
        return (v.view(np.uint32) >> 16).astype(utype).tobytes()
    return v.astype("<f2" if dtype == "F16" else "<f4").tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["constant", "nan", "random", "weights"]), dtype=st.sampled_from(sorted(_FLOATS)),
       n=st.integers(1, 6000), C=st.integers(0, 70), offset=st.integers(0, 200), tail=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_floatsplit_encoders_write_the_same_payload_and_it_decodes_back(
        kind, dtype, n, C, offset, tail, seed):
    width = _FLOATS[dtype][1]
    data = _float_chunk(kind, dtype, n, C, seed) + bytes(range(tail))
    hint = ChunkHint(dtype, width, shape=(-(-n // C), C) if C else (n,), offset=offset * width)
    compiled, reference = compiled_then_numpy(lambda: encode_with("floatsplit", data, hint))
    assert compiled == reference
    _decodes_back_both_ways(compiled, data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["constant", "random", "columns"]), n=st.integers(256, 40000),
       C=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_entropy_encoders_write_the_same_payload_and_it_decodes_back(kind, n, C, seed):
    rng = np.random.default_rng(seed)
    if kind == "constant":
        a = np.full(n, rng.integers(0, 256), dtype=np.uint8)
    elif kind == "random":
        a = rng.integers(0, 256, n, dtype=np.uint8)
    else:       # int8 columns of very different spread
        scale = rng.uniform(0.1, 60, C)[np.arange(n) % C]
        a = np.clip(rng.normal(0, 1, n) * scale, -127, 127).astype(np.int8).view(np.uint8)
    data = a.tobytes()
    hint = ChunkHint("I8", 1, shape=(-(-n // C), C))
    compiled, reference = compiled_then_numpy(lambda: encode_with("entropy", data, hint))
    assert compiled == reference
    _decodes_back_both_ways(compiled, data)


@settings(max_examples=200, deadline=None)
@given(E=st.integers(1, 300), C=st.integers(1, 40), n=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1),
       spread=st.sampled_from(["uniform", "constant", "skewed"]))
def test_row_edges_from_the_counting_pass_are_numpys_quantiles_to_the_last_bit(E, C, n, seed, spread):
    rng = np.random.default_rng(seed)
    shift = int(rng.integers(0, C))
    if spread == "uniform":
        e = rng.integers(0, E, n)
    elif spread == "constant":
        e = np.full(n, rng.integers(0, E))
    else:
        e = np.minimum(rng.geometric(0.4, n) - 1, E - 1)
    e = e.astype(np.uint16)
    mean = np.empty((n - 1 + shift) // C + 1, dtype=np.float64)
    tans._loop.row_means(e, n, C, shift, mean)
    got = floatsplit._row_edges(e, n, C, shift, E, mean)
    assert got.view(np.uint64).tolist() == np.quantile(mean, floatsplit._EIGHTHS).view(np.uint64).tolist()


def test_row_order_stats_refuses_ranks_outside_the_rows_and_exponents_outside_the_range():
    e = np.array([0, 1, 2, 3], dtype=np.uint16)
    out = np.empty(1, dtype=np.float64)
    with pytest.raises(ValueError, match="bad arguments"):
        tans._loop.row_order_stats(e, 4, 2, 0, 4, np.array([2], dtype=np.int64), out)
    with pytest.raises(ValueError, match="outside the range"):
        tans._loop.row_order_stats(e, 4, 2, 0, 3, np.array([1], dtype=np.int64), out)
    assert tans._loop.row_order_stats(e, 4, 2, 0, 4, np.array([1], dtype=np.int64), out) and out[0] == 2.5


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 5000), C=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_column_histogram_is_numpys_bincount(n, C, seed):
    a = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    got = np.zeros((C, 256), dtype=np.int64)
    tans._loop.column_hist(a, n, C, got)
    want = np.bincount((np.arange(n) % C) * 256 + a, minlength=C * 256).reshape(C, 256)
    assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3000), S=st.integers(1, 400), K=st.integers(1, 5), R=st.integers(4, 15),
       lanes=st.integers(1, 40), interleaved=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_encoder_slots_counted_from_the_built_tables_give_the_numpy_encoders_stream(n, S, K, R, lanes,
                                                                                   interleaved, seed):
    S = min(S, 1 << R)
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(rng.uniform(0.02, 0.9), size=n) - 1, S - 1)
    ctx = rng.integers(0, K, size=n)
    counts = np.ones((K, S), dtype=np.int64) + rng.integers(0, 50, (K, S)) * (rng.random((K, S)) < 0.5)
    freqs = tans.quantize_rows(counts, R)

    def encode():   # tables built afresh in each path: the compiled one counts its slots
        return tans.encode(sym, tans.Tables(freqs, R), lanes, ctx=ctx, interleaved=interleaved)
    compiled, reference = compiled_then_numpy(encode)
    assert compiled == reference
    out, _ = tans.decode(compiled, n, tans.Tables(freqs, R), lanes, ctx=ctx, interleaved=interleaved)
    assert np.array_equal(out, sym)


def test_encoder_slots_refuse_entries_that_do_not_match_the_frequencies():
    freqs = np.array([[8, 8]], dtype=np.int64)
    tab = tans.Tables(freqs, 4)
    enc = np.empty(16, dtype=np.int64)
    with pytest.raises(ValueError, match="do not match"):
        tans._loop.encode_slots(tab.packed, 1, 2, 4, np.array([[9, 7]], dtype=np.int64), enc)
