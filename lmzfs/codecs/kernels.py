"""Which kernels the codecs run: the compiled loops or their numpy reference.

The compiled extension (lmzfs/codecs/_tans*.c, built at install) computes the same bytes as
the numpy lines it stands in for, many times faster; every codec has a numpy reference path
that reads every store without it. This module is the one place that decides between them:
a codec asks ``compiled()`` where it would run a compiled kernel, and takes its numpy path
when the answer is None.

The compiled module is imported once, unless it is absent (no C compiler at install) or the
environment sets LMZFS_PURE_TANS=1. Tests that compare the two paths run the numpy one with
``reference_only()`` (and the compiled loop's scalar steps with ``scalar_steps()``); the
pytest fixtures ``tans_loop`` (tests/codecs/conftest.py) and ``reference_kernels``
(tests/reader/conftest.py) wrap them.
"""
from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Iterator

# The compiled tANS decode loop packs a symbol into 13 bits: larger alphabets take numpy's path.
COMPILED_MAX_SYMBOLS = 1 << 13


def _load() -> ModuleType | None:
    """The compiled module, unless absent or LMZFS_PURE_TANS=1."""
    if os.environ.get("LMZFS_PURE_TANS") == "1":
        return None
    try:
        from . import _tansloop
    except ImportError:
        return None
    return _tansloop


_BUILT = _load()
_active = _BUILT


def compiled() -> ModuleType | None:
    """The compiled kernels' module, or None: then the codecs run their numpy reference paths
    (the extension is not built, LMZFS_PURE_TANS=1, or inside ``reference_only()``)."""
    return _active


def built() -> ModuleType | None:
    """The compiled module as imported, even inside ``reference_only()``; None if not built."""
    return _BUILT


def select(module: ModuleType | None) -> None:
    """From now on run the compiled kernels (module: the one ``built()`` returns) or the numpy
    reference (None). The unscoped switch, kept for the old ``tans._loop = ...`` spelling;
    prefer ``reference_only()``, which puts the choice back."""
    global _active
    if module is not None and module is not _BUILT:
        raise ValueError("kernels.select takes None or kernels.built()")
    _active = module


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Within the block every codec runs its numpy reference path, in every thread; the
    choice made before comes back after it. Process-wide, as codecs run on worker threads:
    not for tests that run concurrently with others."""
    saved = _active
    select(None)
    try:
        yield
    finally:
        select(saved)


@contextlib.contextmanager
def scalar_steps() -> Iterator[None]:
    """Within the block the compiled tANS decode loop runs its scalar steps even where the CPU
    has vector ones (a no-op where the extension is not built)."""
    loop = _BUILT
    if loop is None:
        yield
        return
    isa = loop.vector_isa()
    loop.vector_isa("off")
    try:
        yield
    finally:
        loop.vector_isa(isa)
