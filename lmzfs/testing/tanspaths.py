"""Run a computation through the compiled tANS loops and then through the numpy reference path,
for tests that the two give the same bytes (or the same error)."""
from __future__ import annotations

from typing import Callable, TypeVar

from lmzfs.codecs import CodecError, kernels

T = TypeVar("T")


def compiled_then_numpy(compute: Callable[[], T]) -> tuple[T, T]:
    """(compute() with the compiled kernels, compute() with numpy only, in
    kernels.reference_only()); the compiled kernels are back after it."""
    if kernels.compiled() is None:
        raise AssertionError("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; "
                             "`pip install -e .` builds it")
    compiled = compute()
    with kernels.reference_only():
        return compiled, compute()


def value_or_error(compute: Callable[[], T]) -> T | str:
    """compute()'s result, or the message of the CodecError it raised: what damaged input gives,
    as a value by which the two paths' outcomes compare."""
    try:
        return compute()
    except CodecError as exc:
        return f"CodecError: {exc}"
