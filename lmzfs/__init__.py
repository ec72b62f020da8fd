"""lmzfs: a lossless, deduplicated store for model files, served back as ordinary files."""

__version__ = "0.1.0"

import os as _os

# lmzfs never multiplies matrices, but numpy's OpenBLAS starts a spinning thread per core on
# import; on a small host they take CPU from the decoders. Only a default: a value
# the user set wins, and it has no effect if numpy was imported first.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

# Loaded on first use, so `import lmzfs` (and `from lmzfs import __version__`) stays cheap.
_LAZY = {"pack_file": "lmzfs.singlefile", "unpack_file": "lmzfs.singlefile",
         "PackReport": "lmzfs.singlefile", "UnpackReport": "lmzfs.singlefile",
         "SingleFileError": "lmzfs.singlefile"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmzfs' has no attribute {name!r}")
