"""lmzfs: a lossless, deduplicated store for model files, served back as ordinary files."""

__version__ = "0.1.0"

# Loaded on first use, so `import lmzfs` (and `from lmzfs import __version__`) stays cheap.
_LAZY = {"pack_file": "lmzfs.singlefile", "unpack_file": "lmzfs.singlefile",
         "PackReport": "lmzfs.singlefile", "UnpackReport": "lmzfs.singlefile",
         "SingleFileError": "lmzfs.singlefile"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmzfs' has no attribute {name!r}")
