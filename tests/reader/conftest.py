"""Fixtures of the reader tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def reference_kernels():
    """The test runs with the codecs' numpy reference kernels only (kernels.reference_only())."""
    from lmzfs.codecs import kernels
    with kernels.reference_only():
        yield
