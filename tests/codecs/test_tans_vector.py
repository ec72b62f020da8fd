"""The compiled loop's AVX-512 steps (_tansvec.c) against its scalar steps: the same symbols, end
states, stream position and errors, on streams shaped as the codecs make them (16384 lanes of
32 steps for floatsplit) and on the edges the vector loop hands over (partial vectors, the
stream's last bytes, short streams)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmzfs.codecs import CodecError, kernels, tans


def _cpu_has_avx512() -> bool:
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags


def _vector_loop_name(env: dict) -> str:
    code = "from lmzfs.codecs import kernels; print(kernels.compiled().vector_isa())"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_the_vector_steps_are_chosen_exactly_where_the_cpu_has_avx512():
    assert kernels.compiled() is not None, "the compiled tANS loop is not built"
    assert _vector_loop_name({"LMZFS_TANS_VECTOR": ""}) == ("avx512" if _cpu_has_avx512() else "off")
    assert _vector_loop_name({"LMZFS_TANS_VECTOR": "off"}) == "off"


def test_asking_for_a_vector_loop_the_module_does_not_have_is_an_error():
    with pytest.raises(ValueError, match="avx2 is not available"):
        kernels.compiled().vector_isa("avx2")
    if not _cpu_has_avx512():
        with pytest.raises(ValueError, match="avx512 is not available"):
            kernels.compiled().vector_isa("avx512")


@pytest.fixture(scope="module")
def vector_loop():
    if kernels.compiled() is None:
        pytest.fail("the compiled tANS loop is not built")
    if not _cpu_has_avx512():
        pytest.skip("this CPU has no AVX-512: the compiled loop runs its scalar steps only")
    loop = kernels.compiled()
    saved = loop.vector_isa()
    yield loop
    loop.vector_isa(saved)


def _both_steps(loop, decode) -> list:
    """decode() with the vector steps, then with the scalar ones: (symbols bytes, end states) or
    the error message."""
    out = []
    for isa in ("avx512", "off"):
        loop.vector_isa(isa)
        try:
            sym, fin = decode()
            out.append((sym.tobytes(), fin.tolist()))
        except CodecError as exc:
            out.append(str(exc))
    return out


def _case(mode: str, n: int, lanes: int, S: int, K: int, R: int, seed: int):
    rng = np.random.default_rng(seed)
    sym = np.minimum(rng.geometric(0.08, n) - 1, S - 1)
    freqs = np.stack([tans.quantize(np.bincount(sym, minlength=S) + 1 + k, R) for k in range(K)])
    tab = tans.Tables(freqs, R)
    kw: dict = {}
    if mode == "dyn":
        kw["dyn"] = (rng.integers(0, K, S), int(rng.integers(0, K)))
    elif mode in ("ctx8", "ctx64"):
        kw["ctx"] = rng.integers(0, K, n).astype(np.uint8 if mode == "ctx8" else np.int64)
    interleaved = mode != "dyn" and mode != "plain"
    wp = tans.layout(n, lanes, interleaved)[1]
    bb = rng.integers(0, 1 << R, wp)
    stream = tans.encode(sym, tab, lanes, interleaved=interleaved, bits_back=bb, **kw)
    return sym, bb, tab, kw, interleaved, stream


@pytest.mark.parametrize("mode,values", [("dyn", np.uint16), ("dyn", np.uint8), ("plain", np.uint16),
                                         ("interleaved", np.uint8), ("ctx8", np.uint16),
                                         ("ctx8", np.uint8), ("ctx64", np.uint16), ("ctx64", np.uint32)])
def test_vector_and_scalar_steps_agree_on_chunk_sized_streams_good_and_damaged(vector_loop, mode, values):
    # floatsplit's shape: 2**19 symbols, 16384 lanes, 32 steps, 16-bit values
    n, lanes = 1 << 19, 1 << 14
    sym, bb, tab, kw, il, stream = _case(mode, n, lanes, S=300, K=4, R=12, seed=len(mode))
    vals = np.random.default_rng(1).integers(0, np.iinfo(values).max, 300, dtype=np.uint64).astype(values)
    damaged = bytearray(stream)
    damaged[len(stream) // 3] ^= 0x5A
    for s in (stream, bytes(damaged), stream[:-3], stream + b"\x00", stream[: len(stream) // 2]):
        got = _both_steps(vector_loop, lambda: tans.decode(s, n, tab, lanes, interleaved=il, values=vals, **kw))
        assert got[0] == got[1], f"{mode}: the loops disagree on a {len(s)}-byte stream"
    good = _both_steps(vector_loop, lambda: tans.decode(stream, n, tab, lanes, interleaved=il, values=vals, **kw))
    assert good[0] == (vals[sym].tobytes(), bb.tolist())


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 5000), lanes=st.integers(1, 600), S=st.integers(1, 200), K=st.integers(1, 5),
       mode=st.sampled_from(["dyn", "plain", "interleaved", "ctx8", "ctx64"]), cut=st.integers(0, 40),
       seed=st.integers(0, 2**32 - 1))
def test_vector_and_scalar_steps_agree_at_every_hand_over(vector_loop, n, lanes, S, K, mode, cut, seed):
    # lane counts that leave partial vectors, streams near the 128-byte floor, and streams cut
    # short inside the last window, where the vector steps hand over to the scalar ones
    sym, bb, tab, kw, il, stream = _case(mode, n, lanes, S, K, R=10, seed=seed)
    s = stream[: max(0, len(stream) - cut)] if cut % 3 else stream
    got = _both_steps(vector_loop, lambda: tans.decode(s, n, tab, lanes, interleaved=il, **kw))
    assert got[0] == got[1]
    if s is stream:
        assert got[0] == (sym.astype(np.int64).tobytes(), bb.tolist())
