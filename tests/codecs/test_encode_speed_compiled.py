"""The compiled encoder passes (lmzfs/codecs/_tansfit.c, _tanscolumns.c) against the numpy code they
stand in for: the same choices and payload bytes, on adversarial chunks (constant, all-NaN, random,
tiny, odd sizes, rows of very different scale), and payloads that both decode paths give back exactly."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import decode_chunk, encode_with, entropy, floatsplit, kernels, tans
from lmzfs.codecs.base import ChunkHint
from lmzfs.testing.tanspaths import compiled_then_numpy


@pytest.fixture(autouse=True)
def _compiled_loop_built():
    if kernels.compiled() is None:
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


@pytest.mark.parametrize("dtype", sorted(_FLOATS))
@pytest.mark.parametrize("codec", ["floatsplit", "floatseg"])
def test_float_elements_at_an_odd_address_encode_to_the_same_payload(codec, dtype):
    width = _FLOATS[dtype][1]
    data = _float_chunk("weights", dtype, 70_001, 100, 9) + b"\x01"
    shifted = memoryview(b"\x00" + data)[1:]       # the elements start at an odd address
    hint = ChunkHint(dtype, width, shape=(700, 100))
    assert encode_with(codec, shifted, hint) == encode_with(codec, data, hint)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(sorted(_FLOATS)), n=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_encoders_find_the_same_zero_blocks_of_stored_planes(dtype, n, seed):
    # weights whose stored low bits are cleared over random runs of elements, to different
    # depths: blocks of 64 with none, some and all of their stored planes zero, and partial ones
    rng = np.random.default_rng(seed)
    utype, width = _FLOATS[dtype]
    v = rng.normal(0, 1, n).astype(np.float32)
    u = (v.view(np.uint32) >> 16).astype(utype) if dtype == "BF16" else v.astype("<f2" if dtype == "F16" else "<f4").view(utype)
    depth = rng.integers(0, 8 * width, -(-n // 48))[np.arange(n) // 48]
    u = u & ~((np.ones(n, dtype=np.uint64) << depth.astype(np.uint64)) - 1).astype(utype)
    data = u.astype(utype).tobytes()
    compiled, reference = compiled_then_numpy(lambda: encode_with("floatsplit", data, ChunkHint(dtype, width)))
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
    kernels.compiled().row_means(e, n, C, shift, mean)
    got = floatsplit._row_edges(e, n, C, shift, E, mean)
    assert got.view(np.uint64).tolist() == np.quantile(mean, floatsplit._EIGHTHS).view(np.uint64).tolist()


def test_row_order_stats_refuses_ranks_outside_the_rows_and_exponents_outside_the_range():
    e = np.array([0, 1, 2, 3], dtype=np.uint16)
    out = np.empty(1, dtype=np.float64)
    with pytest.raises(ValueError, match="bad arguments"):
        kernels.compiled().row_order_stats(e, 4, 2, 0, 4, np.array([2], dtype=np.int64), out)
    with pytest.raises(ValueError, match="outside the range"):
        kernels.compiled().row_order_stats(e, 4, 2, 0, 3, np.array([1], dtype=np.int64), out)
    assert kernels.compiled().row_order_stats(e, 4, 2, 0, 4, np.array([1], dtype=np.int64), out) and out[0] == 2.5


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
        kernels.compiled().encode_slots(tab.packed, 1, 2, 4, np.array([[9, 7]], dtype=np.int64), enc)


def _column_bytes(kind: str, rows: int, C: int, tail: int, seed: int) -> np.ndarray:
    """rows of C bytes and a short row of ``tail``: adversarial kinds (ties between classes and
    columns everywhere) and int8 columns of very different spread."""
    rng = np.random.default_rng(seed)
    n = rows * C + tail
    if kind == "constant":
        return np.full(n, rng.integers(0, 256), dtype=np.uint8)
    if kind == "two values":
        p = rng.uniform(0.05, 0.95)
        return rng.choice(rng.integers(0, 256, 2).astype(np.uint8), n, p=[p, 1 - p])
    if kind == "random":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "skewed":    # a few values, most of them one
        return (np.minimum(rng.geometric(rng.uniform(0.3, 0.95), n) - 1, 255) + rng.integers(0, 256)).astype(np.uint8)
    if kind == "two column kinds":      # half the columns constant, half random: exact ties within each half
        a = rng.integers(0, 256, n, dtype=np.uint8)
        a[(np.arange(n) % C) % 2 == 0] = 7
        return a
    scale = rng.uniform(0.05, 60, C)[np.arange(n) % C]
    return np.clip(rng.normal(0, 1, n) * scale, -127, 127).astype(np.int8).view(np.uint8)


def _same_column_classes(compiled, reference) -> None:
    if reference is None:
        assert compiled is None
    else:
        assert compiled is not None and compiled[0] == reference[0]
        assert compiled[1].tolist() == np.asarray(reference[1]).tolist()


_COLUMN_KINDS = ["constant", "two values", "random", "skewed", "two column kinds", "columns"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(_COLUMN_KINDS), C=st.integers(8, 400), rows=st.integers(32, 160),
       tail=st.integers(0, 399), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_column_class_search_chooses_what_the_numpy_reference_chooses(kind, C, rows, tail, seed):
    a = _column_bytes(kind, rows, C, tail % C, seed)
    _same_column_classes(*compiled_then_numpy(lambda: entropy._column_classes(a, C)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(C=st.integers(64, 800), rows=st.integers(300, 1400), tail=st.integers(0, 799), seed=st.integers(0, 2**32 - 1))
def test_the_compiled_column_class_search_agrees_where_eight_or_sixteen_classes_pay(C, rows, tail, seed):
    """Columns of widely spread scales over many rows, where the search chooses 8 or 16 classes."""
    rng = np.random.default_rng(seed)
    n = rows * C + tail % C
    scale = np.exp(rng.uniform(np.log(0.3), np.log(80), C))[np.arange(n) % C]
    a = np.clip(np.rint(rng.standard_t(5, n) * scale), -127, 127).astype(np.int8).view(np.uint8)
    _same_column_classes(*compiled_then_numpy(lambda: entropy._column_classes(a, C)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(_COLUMN_KINDS), C=st.integers(8, 300), rows=st.integers(32, 200),
       tail=st.integers(0, 299), seed=st.integers(0, 2**32 - 1))
def test_entropy_payloads_with_column_classes_are_the_same_bytes_with_and_without_the_compiled_search(
        kind, C, rows, tail, seed):
    data = _column_bytes(kind, rows, C, tail % C, seed).tobytes()
    hint = ChunkHint("I8", 1, shape=(-(-len(data) // C), C))
    compiled, reference = compiled_then_numpy(lambda: encode_with("entropy", data, hint))
    assert compiled == reference
    _decodes_back_both_ways(compiled, data)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(min_value=2.0**-40, max_value=1.0), bits=st.integers(0, 45))
def test_the_fixed_point_logarithm_is_log2_rounded_to_within_one_unit(x, bits):
    got = entropy._log2_fixed(np.array([x]), bits)[0]
    assert got == np.rint(got) and abs(got - np.log2(x) * 2.0**bits) <= 1


def test_the_column_class_search_refuses_rows_it_does_not_search():
    cls = np.empty(8, dtype=np.int64)
    with pytest.raises(ValueError, match="bad arguments"):
        kernels.compiled().column_classes(np.zeros(8 * 31, dtype=np.uint8), 8 * 31, 8, 30, 30, entropy._LOG2_SERIES, 3, 300, cls)
    with pytest.raises(ValueError, match="bad arguments"):
        kernels.compiled().column_classes(np.zeros(7 * 40, dtype=np.uint8), 7 * 40, 7, 30, 30, entropy._LOG2_SERIES, 3, 300, cls)
