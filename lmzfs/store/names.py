"""Model names: "minilm", or "run1/step-1000" for families. They become directories in the mount."""
from __future__ import annotations

from lmzfs.printable import first_control_character, is_utf8, printable
from lmzfs.store.layout import StoreError

MAX_NAME = 255
RESERVED_TOP = (".lmzfs", ".hf")   # the mount keeps these top-level names: its own files, the HF cache view


def validate_model_name(name: str) -> str:
    if not name:
        raise StoreError("model name is empty")
    if not is_utf8(name):
        raise StoreError(f"model name '{printable(name)}' is not valid UTF-8")
    if len(name.encode()) > MAX_NAME:
        raise StoreError(f"model name is longer than {MAX_NAME} bytes")
    if name.startswith("/"):
        raise StoreError(f"model name {name!r} is absolute; use a relative name such as 'llama' or 'run1/step-1000'")
    bad = first_control_character(name)
    if bad is not None:
        # C0/C1 controls, line separators and bidi overrides: a name that prints as another name
        raise StoreError(f"model name '{printable(name)}' contains the control character {bad}; "
                         f"use plain letters, digits and punctuation")
    if "\\" in name:
        raise StoreError(f"model name {name!r} contains a backslash")
    parts = name.split("/")
    for p in parts:
        if p in ("", ".", ".."):
            raise StoreError(f"model name {name!r} has an empty, '.' or '..' component")
    if parts[0] in RESERVED_TOP:
        raise StoreError(f"model name {name!r} uses the reserved top-level name {parts[0]!r}")
    return name


def validate_file_path(path: str) -> str:
    """A path inside a model, as found by walking the added directory."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise StoreError(f"unusable file path {path!r}")
    if not is_utf8(path):
        # the catalog and the mount keep names as UTF-8 text; bytes that are not cannot be stored
        raise StoreError(f"file name '{printable(path)}' is not valid UTF-8; rename it (e.g. with convmv) "
                         f"and add again")
    return path
