"""The dtype of each storage a PyTorch checkpoint's data.pkl names, read from its opcodes, never run.

torch.save pickles a tensor's storage as a persistent id, the tuple ('storage', StorageType, key,
location, numel) with StorageType a global such as torch.BFloat16Storage; the storage's bytes
are the zip entry <archive>/data/<key>. pickletools.genops only parses opcodes. Tracking what
builds such a tuple (MARK, strings, ints, globals, the memo, TUPLE, then BINPERSID) gives each
key its dtype; any other opcode inside a tuple makes it not one, and a pickle that does not parse
yields what was found before the fault. Nothing is imported, called or built.
"""
from __future__ import annotations

import pickletools
from dataclasses import dataclass

# torch's storage classes -> (dtype as the codecs spell it, bytes per element)
STORAGE_DTYPES = {"FloatStorage": ("F32", 4), "DoubleStorage": ("F64", 8), "HalfStorage": ("F16", 2),
                  "BFloat16Storage": ("BF16", 2), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
                  "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
                  "BoolStorage": ("BOOL", 1)}

_STRINGS = {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_INTS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


class _Other:
    """A value this walk does not follow."""


_OTHER = _Other()


def storage_dtypes(data: bytes) -> dict[str, tuple[str, int]]:
    """Storage key -> (dtype, itemsize) for every torch storage persistent id in the pickle."""
    found: dict[str, tuple[str, int]] = {}
    memo: dict[int, object] = {}
    run: list | None = None         # the simple values pushed since the innermost MARK
    pushed: object = _OTHER         # the last value pushed (what a PUT memoizes)
    tuple_: tuple | None = None     # a tuple just built, awaiting BINPERSID
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in _PUTS or name == "MEMOIZE":
                memo[arg if name != "MEMOIZE" else len(memo)] = pushed
                continue
            value: object = _OTHER
            if name == "MARK":
                run, pushed, tuple_ = [], _OTHER, None
                continue
            if name in _STRINGS:
                value = arg if isinstance(arg, str) else _OTHER
            elif name in _INTS:
                value = arg if isinstance(arg, int) else _OTHER
            elif name == "GLOBAL" and isinstance(arg, str) and " " in arg:
                value = _Global(*arg.split(" ", 1))
            elif name == "STACK_GLOBAL" and run is not None and len(run) >= 2 \
                    and all(isinstance(v, str) for v in run[-2:]):
                value = _Global(run.pop(-2), run.pop())
            elif name in _GETS:
                value = memo.get(arg, _OTHER)
            elif name == "TUPLE" and run is not None:
                tuple_, run, pushed = tuple(run), None, _OTHER
                continue
            elif name in ("BINPERSID", "PERSID") and tuple_ is not None:
                _record(found, tuple_)
            elif name == "STOP":
                break
            else:
                run, tuple_, pushed = None, None, _OTHER
                continue
            tuple_ = None
            pushed = value
            if run is not None:
                run.append(value)
    except (ValueError, EOFError, KeyError, UnicodeDecodeError, OverflowError):
        pass                                # a pickle cut short or damaged: what came before holds
    return found


def _record(found: dict[str, tuple[str, int]], pid: tuple) -> None:
    if len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], _Global) or not isinstance(pid[2], str):
        return
    if pid[1].module == "torch" and pid[1].name in STORAGE_DTYPES:
        found[pid[2]] = STORAGE_DTYPES[pid[1].name]
