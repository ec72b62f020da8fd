"""lmzfs: a lossless, deduplicated store for model files, served back as ordinary files."""

__version__ = "0.1.0"
