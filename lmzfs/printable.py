"""Text from untrusted places (file and tensor names, zip members, GGUF metadata) made safe to print.

A name may hold an ESC that recolours or rewrites the terminal, a newline that forges another
line of output, or a bidi override that shows a different name than the one stored. Output of
such text escapes every character that controls rather than shows, so that each printed line is
one line and reads as the bytes it stands for.
"""
from __future__ import annotations

import re

# C0 and C1 controls and DEL; the Unicode line and paragraph separators; the bidi embeddings,
# overrides and isolates (U+202A-E, U+2066-9) and the implicit direction marks (U+200E-F, U+061C).
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
# Lone surrogates: how Python spells a file name's bytes that are not UTF-8 (U+DC80-DCFF for byte
# 0x80-0xFF); they cannot be written to a UTF-8 terminal at all.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c"
                          "\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def is_utf8(text: str) -> bool:
    """Whether ``text`` came from valid UTF-8 (it holds no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(text: str) -> str:
    """``text`` with each control character (and each byte that was not UTF-8) written as a
    \\xNN or \\uNNNN escape."""
    return _UNPRINTABLE.sub(_escape, text)


def first_control_character(text: str) -> str | None:
    """The first control character of ``text``, escaped, or None."""
    m = CONTROL_CHARACTERS.search(text)
    return None if m is None else _escape(m)
