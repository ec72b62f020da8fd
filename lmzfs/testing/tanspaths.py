"""Run a computation through the compiled tANS loops and then through the numpy reference path,
for tests that the two give the same bytes (or the same error)."""
from __future__ import annotations

from typing import Callable, TypeVar

from lmzfs.codecs import CodecError, tans

T = TypeVar("T")


def compiled_then_numpy(compute: Callable[[], T]) -> tuple[T, T]:
    """(compute() with the compiled loop, compute() with numpy only); the loop is put back after."""
    if tans._loop is None:
        raise AssertionError("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; "
                             "`pip install -e .` builds it")
    saved = tans._loop
    try:
        compiled = compute()
        tans._loop = None
        return compiled, compute()
    finally:
        tans._loop = saved



def value_or_error(compute: Callable[[], T]) -> T | str:
    """compute()'s result, or the message of the CodecError it raised: what damaged input gives,
    as a value by which the two paths' outcomes compare."""
    try:
        return compute()
    except CodecError as exc:
        return f"CodecError: {exc}"
