"""The compiled tANS helpers (lmzfs/codecs/_tans*.c) against their numpy twins: same values, same
errors. Each test runs both paths itself, so it needs the compiled loop built; the module
fails rather than compare the numpy path with itself."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import CodecError
from lmzfs.codecs import entropy, kernels, tans, uintlist
from lmzfs.codecs.ggufblocks import LAYOUTS


@pytest.fixture(autouse=True)
def _compiled_loop_built():
    if kernels.compiled() is None:
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; `pip install -e .` builds it")


def _outcome(compute, errors):
    try:
        return compute()
    except errors as exc:
        return str(exc)


def _through_both_loops(compute, errors=(CodecError,)) -> list:
    """compute() run through the compiled tANS loop, then through the numpy one: each result, or
    the message of an error in ``errors`` (so that the two paths can be compared as values). The
    compiled run is made with each of its step loops (vector and scalar), which must agree."""
    compiled = [_outcome(compute, errors)]
    if kernels.compiled().vector_isa() != "off":    # the vector steps ran: the scalar ones too
        with kernels.scalar_steps():
            compiled.append(_outcome(compute, errors))
    assert all(c == compiled[0] for c in compiled[1:]), "the vector and scalar step loops disagree"
    with kernels.reference_only():
        return [compiled[0], _outcome(compute, errors)]


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
    from lmzfs.codecs import _tansloop as loop
    tab = tans.Tables(tans.quantize_rows(np.array([[5, 3, 1, 7]]), 6), 6)
    vals = np.arange(4, dtype=np.uint8)
    stream = np.zeros(64, dtype=np.uint8)

    def call(states=None, out=None, ctx=None, n=100, T=10, Wp=10, L=64, values=vals, packed=tab.packed):
        states = np.zeros(Wp, dtype=np.int64) if states is None else states
        out = np.empty(n, dtype=np.uint8) if out is None else out
        return loop.decode(packed, packed.dtype == np.uint32, False, stream, states, out, values, ctx, None, True,
                           n, T, Wp, L, Wp * 6)

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
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    fin = rng.integers(0, 1 << R, size=wp)
    m = data.draw(st.integers(0, wp * R // 8))
    if data.draw(st.booleans()):
        fin[(8 * m) // R:] = 0        # often nothing past the stored bytes
    results = _through_both_loops(lambda: tans.bits_back_bytes(fin, R, m).tobytes())
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
        ggufblocks.merge_nibbles(out, nib, nblk, bsize, foff, fsize)
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3000), S=st.integers(1, 300), K=st.integers(1, 4), R=st.integers(4, 15),
       lanes=st.integers(1, 70), interleaved=st.booleans(), mode=st.sampled_from(["plain", "ctx", "dyn"]),
       seed=st.integers(0, 2**32 - 1), bits_back=st.booleans())
def test_the_compiled_encoder_writes_exactly_the_numpy_encoders_stream(n, S, K, R, lanes, interleaved, mode,
                                                                       seed, bits_back):
    if mode == "dyn" and interleaved:
        interleaved = False
    if S > 1 << R:
        S = 1 << R
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(rng.uniform(0.05, 0.9), size=n) - 1, S - 1)
    ctx = rng.integers(0, K, size=n) if mode == "ctx" else None
    dyn = (rng.integers(0, K, size=S), int(rng.integers(0, K))) if mode == "dyn" else None
    tab = tans.Tables(tans.quantize_rows(np.ones((K, S), dtype=np.int64) + np.bincount(sym, minlength=S), R), R)
    bb = rng.integers(0, 1 << R, size=tans.layout(n, lanes, interleaved)[1]) if bits_back else None

    def encode():
        return tans.encode(sym, tab, lanes, ctx=ctx, dyn=dyn, bits_back=bb, interleaved=interleaved)
    compiled, reference = _through_both_loops(encode, errors=(ValueError,))
    assert type(compiled) is bytes and compiled == reference
    out, _ = tans.decode(compiled, n, tab, lanes, ctx=ctx, dyn=dyn, interleaved=interleaved)
    assert np.array_equal(out, sym)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), S=st.integers(2, 300), K=st.integers(1, 6), R=st.integers(9, 15),
       lanes=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_the_encoder_writes_the_same_stream_from_16_and_64_bit_table_rows(n, S, K, R, lanes, seed):
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(rng.uniform(0.05, 0.9), size=n) - 1, S - 1)
    ctx = rng.integers(0, K, size=n)
    tab = tans.Tables(tans.quantize_rows(np.ones((K, S), dtype=np.int64) + np.bincount(sym, minlength=S), R), R)
    rows = ctx * S + sym
    wide = tans.encode_table_rows(rows.astype(np.int64), tab, lanes, interleaved=True)
    assert tans.encode_table_rows(rows.astype(np.uint16), tab, lanes, interleaved=True) == wide
    assert wide == tans.encode(sym, tab, lanes, ctx=ctx, interleaved=True)


@pytest.mark.parametrize("dtype", [np.int64, np.uint16])
def test_the_encoder_refuses_a_row_of_zero_frequency_or_past_the_tables(dtype):
    freqs = np.array([[512, 512, 0]], dtype=np.int64)
    tab = tans.Tables(freqs, 10)
    assert tans.encode_table_rows(np.array([0, 1, 1, 0], dtype=dtype), tab, 2)    # rows 0 and 1 code
    with pytest.raises(ValueError, match="zero frequency"):
        tans.encode_table_rows(np.array([0, 2, 1, 0], dtype=dtype), tab, 2)
    with pytest.raises(ValueError, match="row index is out of range"):
        tans.encode_table_rows(np.array([0, 3, 1, 0], dtype=dtype), tab, 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**35 - 1) | st.sampled_from([0, 127, 128, 16383, 16384, 2**35 - 1]), max_size=60))
def test_the_compiled_varint_writer_writes_the_reference_bytes_and_reads_back(values):
    v = np.array(values, dtype=np.int64)
    assert kernels.compiled().to_varints(v) == uintlist._varints(v)
    blob = uintlist.pack_uints(v)
    assert uintlist.unpack_uints(blob, len(values), "t").tolist() == values


@pytest.mark.parametrize("bad", [-1, 2**35])
def test_table_values_outside_35_bits_are_refused_on_both_paths(bad):
    v = np.array([5, bad], dtype=np.int64)
    assert kernels.compiled().to_varints(v) is None
    with pytest.raises(ValueError, match="not an unsigned integer under 2\\*\\*35"):
        uintlist.pack_uints(v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6000), S=st.sampled_from([2, 3, 16, 17, 256, 300]), K=st.integers(1, 5),
       lanes=st.integers(1, 400), skew=st.floats(0.02, 0.95), seed=st.integers(0, 2**32 - 1),
       byte_symbols=st.booleans())
def test_the_compiled_section_model_chooses_exactly_the_reference_tables_and_tail_width(n, S, K, lanes, skew, seed,
                                                                                       byte_symbols):
    from lmzfs.codecs import entropy
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(skew, size=n) - 1, S - 1)
    ctx = rng.integers(0, K, size=n) if K > 1 else None
    if byte_symbols and S <= 256:
        sym = sym.astype(np.uint8)
        ctx = None if ctx is None else ctx.astype(np.uint8)
    lanes = min(lanes, n)
    T, wp, _ = tans.layout(n, lanes, True)
    D = min(tans.MAX_R, T)
    freqs = np.empty((K, S), dtype=np.int64)
    R, g = kernels.compiled().section_model(entropy._compiled_symbols(sym), entropy._compiled_symbols(ctx), n, S,
                                            K, T, wp, D, freqs)
    with kernels.reference_only():
        R_ref, g_ref, freqs_ref = entropy._section_model_reference(sym, S, ctx, K, lanes, T, wp, D)
    assert (R, g) == (R_ref, g_ref)
    assert freqs.tolist() == freqs_ref.tolist()
    payload = entropy.tans_section(sym, S, ctx, K, lanes)
    assert entropy.decode_tans_section(payload, n, S, ctx, K).tolist() == sym.tolist()


def test_the_section_model_refuses_a_symbol_past_the_alphabet_on_both_paths():
    from lmzfs.codecs import entropy
    sym = np.array([0, 1, 5, 1], dtype=np.uint8)
    results = _through_both_loops(lambda: entropy.tans_section(sym, 4), errors=(ValueError,))
    assert results == ["tans section: a symbol or context out of range"] * 2
