"""Fixtures of the codec tests: every tANS decode path, small floatseg segments."""
from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def small_segments(monkeypatch) -> int:
    """floatseg encodes with 4 KiB segments, so that small inputs have several; their size."""
    from lmzfs.codecs import floatseg
    monkeypatch.setattr(floatseg, "SEGMENT_LOG", 12)
    return 1 << 12


def _tans_paths() -> list[str]:
    """The compiled loop (with its vector steps where the CPU has them), its scalar steps alone
    where those differ, and numpy."""
    from lmzfs.codecs import kernels
    loop = kernels.compiled()
    vector = loop is not None and loop.vector_isa() != "off"
    return ["compiled", "compiled-scalar", "numpy"] if vector else ["compiled", "numpy"]


@pytest.fixture(scope="module", params=_tans_paths())
def tans_loop(request):
    """Run a module's tests through every tANS decode path: the compiled loop (vector and scalar
    steps) and the numpy one that reads every store without it. They must agree byte for byte,
    errors included. Switched through lmzfs.codecs.kernels, the codecs' one kernel choice."""
    from lmzfs.codecs import kernels
    if kernels.compiled() is None and request.param != "numpy":
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; "
                    "`pip install -e .` builds it")
    with contextlib.ExitStack() as paths:
        if request.param == "numpy":
            paths.enter_context(kernels.reference_only())
        elif request.param == "compiled-scalar":
            paths.enter_context(kernels.scalar_steps())
        yield request.param
