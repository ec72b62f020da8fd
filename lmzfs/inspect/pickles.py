"""Find what a pickle would import, without running it.

The opcodes are disassembled with pickletools.genops and the stack is simulated symbolically
(string constants tracked, everything else opaque), so STACK_GLOBAL's module and name are
recovered even through the memo. Nothing is ever unpickled, and scanning is bounded in bytes
and opcodes.

Allowed imports are what torch.save writes for tensors and state dicts: anything under torch,
a few collections, numpy's array reconstruction, and plain builtin types. Everything else (and
any import whose name cannot be resolved statically) is flagged as suspicious: loading the file
with pickle would import and possibly call it.
"""
from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field

MAX_PICKLE_BYTES = 64 << 20
MAX_OPCODES = 4_000_000     # over all of one file's pickles: a few seconds of disassembly

_SAFE_MODULE_ROOTS = ("torch",)
_SAFE_GLOBALS = frozenset(
    [("collections", n) for n in ("OrderedDict", "defaultdict", "Counter", "deque")]
    + [("builtins", n) for n in ("set", "frozenset", "dict", "list", "tuple", "int", "float", "complex", "bool",
                                 "bytes", "bytearray", "str", "slice", "range")]
    + [(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")]
    + [(m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")]   # protocol 5 arrays
    + [("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")]   # _codecs.encode: bytes in py3 pickles
)
_SAFE_MODULE_PREFIXES = ("numpy.dtypes",)          # numpy.dtypes.Float32DType and friends
_PY2_RENAMES = {"__builtin__": "builtins", "copy_reg": "copyreg"}

_STRING_OPS = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE",
                         "BINUNICODE", "BINUNICODE8"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MARK = object()        # a MARK on the simulated stack
UNRESOLVED = "?"


@dataclass
class PickleScan:
    entry: str                                          # the zip entry (or file) scanned
    size: int
    opcodes: int = 0
    imports: list[str] = field(default_factory=list)    # "module.name", in first-use order
    suspicious: list[str] = field(default_factory=list)
    error: str | None = None                            # malformed or too large; scanning stopped there

    def to_json(self) -> dict:
        return {"entry": self.entry, "size": self.size, "opcodes": self.opcodes, "imports": self.imports,
                "suspicious": self.suspicious, "error": self.error}


def is_allowed(module: str, name: str) -> bool:
    module = _PY2_RENAMES.get(module, module)
    if (module, name) in _SAFE_GLOBALS:
        return True
    if any(module == r or module.startswith(r + ".") for r in _SAFE_MODULE_ROOTS + _SAFE_MODULE_PREFIXES):
        return True
    return False


def scan_pickle(data: bytes, entry: str, budget: "OpcodeBudget | None" = None) -> PickleScan:
    """Every import the pickle in ``data`` would perform, and which of them are suspicious."""
    scan = PickleScan(entry, len(data))
    if len(data) > MAX_PICKLE_BYTES:
        scan.error = f"{len(data)} bytes, more than the {MAX_PICKLE_BYTES} this scanner reads"
        return scan
    _scan_one(memoryview(data), 0, scan, budget or OpcodeBudget())
    return scan


def scan_pickle_stream(data: bytes, entry: str, budget: "OpcodeBudget | None" = None) -> PickleScan:
    """The imports of the pickles at the start of ``data``, back to back, as one scan: a legacy
    torch.save file is five of them (magic number, protocol, system info, the object, storage
    keys) before raw storage bytes, and unpickling it runs all five. A pickle after the first is
    recognised by its PROTO opcode (protocol 2 and later); the scan stops at the first bytes that
    are not one, and an error there is not the file's: those are its storages."""
    view = memoryview(data)[:MAX_PICKLE_BYTES]
    scan = PickleScan(entry, len(data))
    budget = budget or OpcodeBudget()
    pos = _scan_one(view, 0, scan, budget)
    while pos is not None and pos + 1 < len(view) and view[pos] == 0x80 and 2 <= view[pos + 1] <= 5:
        follow = PickleScan(entry, 0)
        follow.imports, follow.suspicious = scan.imports, scan.suspicious
        pos = _scan_one(view, pos, follow, budget)
        scan.opcodes += follow.opcodes
        if follow.error and budget.spent:
            scan.error = follow.error
            break
    return scan


@dataclass
class OpcodeBudget:
    """Opcodes left to disassemble for one inspected file, over all its pickles."""
    left: int = MAX_OPCODES
    spent: bool = False


def _scan_one(data: memoryview, start: int, scan: PickleScan, budget: OpcodeBudget) -> int | None:
    """Scan the pickle at data[start:] into ``scan``; the offset after its STOP, or None when it
    has none (malformed, truncated, or the budget ran out: scan.error says which)."""
    seen = set(scan.imports)

    def found(module: object, name: object) -> None:
        ok = isinstance(module, str) and isinstance(name, str)
        ref = f"{module}.{name}" if ok else f"{module if isinstance(module, str) else UNRESOLVED}." \
                                            f"{name if isinstance(name, str) else UNRESOLVED}"
        if ref not in seen:
            seen.add(ref)
            scan.imports.append(ref)
            if not (ok and is_allowed(module, name)):
                scan.suspicious.append(ref)

    stack: list[object] = []
    memo: dict[int, object] = {}
    stream = io.BytesIO(data)
    stream.seek(start)
    try:
        for op, arg, pos in pickletools.genops(stream):
            scan.opcodes += 1
            budget.left -= 1
            if budget.left < 0:
                budget.spent = True
                raise ValueError(f"more than {MAX_OPCODES} opcodes")
            if op.name in ("GLOBAL", "INST"):
                module, _, name = arg.partition(" ")
                found(module, name)
            elif op.name == "STACK_GLOBAL":
                found(stack[-2] if len(stack) >= 2 else None, stack[-1] if stack else None)
            if op.name in _PUT_OPS or op.name == "MEMOIZE":
                # Memo writes keep the stack as is; MEMOIZE numbers entries in order.
                memo[arg if op.name in _PUT_OPS else len(memo)] = stack[-1] if stack else None
                continue
            _apply_stack_effect(stack, op, pos)
            if op.name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) else None)
            elif op.name in _GET_OPS:
                stack.append(memo.get(arg))
            else:
                stack.extend(_MARK if a is pickletools.markobject else None for a in op.stack_after)
            if op.name == "STOP":
                return stream.tell()
        raise ValueError("no STOP opcode")
    except Exception as exc:   # genops raises several types on malformed input; none may escape
        scan.error = f"malformed pickle after {scan.opcodes} opcodes: {exc}"
    return None


def _apply_stack_effect(stack: list[object], op, pos: int) -> None:
    before = op.stack_before
    if pickletools.markobject in before:
        while stack and stack[-1] is not _MARK:
            stack.pop()
        if not stack:
            raise ValueError(f"{op.name} at byte {pos} has no MARK to pop to")
        stack.pop()
        count = before.index(pickletools.markobject)
    else:
        count = len(before)
    if count > len(stack):
        raise ValueError(f"{op.name} at byte {pos} pops {count} items from a stack of {len(stack)}")
    del stack[len(stack) - count:]
