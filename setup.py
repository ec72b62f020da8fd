"""Only the optional compiled tANS loop (lmzfs/codecs/_tans*.c) lives here; everything else is in pyproject.toml.

optional=True: without a C compiler the install still succeeds and lmzfs uses its numpy loop,
which decodes the same streams, only slower.

-ffp-contract=off: the encoder's compiled searches repeat numpy's floating-point steps one rounding
at a time (see _tanscolumns.c), which a fused multiply-add would break.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("lmzfs.codecs._tansloop",
                             ["lmzfs/codecs/_tansloop.c", "lmzfs/codecs/_tanstables.c",
                              "lmzfs/codecs/_tansfloat.c", "lmzfs/codecs/_tansgguf.c",
                              "lmzfs/codecs/_tanstails.c", "lmzfs/codecs/_tansvec.c",
                              "lmzfs/codecs/_tanscopy.c", "lmzfs/codecs/_tansenc.c",
                              "lmzfs/codecs/_tansulp.c", "lmzfs/codecs/_tansfit.c",
                              "lmzfs/codecs/_tanssection.c", "lmzfs/codecs/_tanscolumns.c",
                              "lmzfs/codecs/_tansparts.c", "lmzfs/codecs/_tansblocks.c",
                              "lmzfs/codecs/_tansstrings.c"],
                             depends=["lmzfs/codecs/_tansloop.h"],
                             optional=True, extra_compile_args=["-O3", "-ffp-contract=off"])])
