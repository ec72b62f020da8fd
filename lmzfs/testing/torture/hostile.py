"""hostile input: generated safetensors, GGUF, ONNX and PyTorch-zip files, honest and hostile
(headers that lie about counts, sizes, offsets and types, then bit flips and truncations),
added in batches; files swapped for a symlink, a FIFO or another file while `lmz add` runs;
hostile model names. Each add stores every file byte for byte or refuses in one `lmz:` line,
never a traceback; the case child's peak RSS (ru_maxrss) is reported and bounded."""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import struct
import time
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np

from lmzfs.testing.onnxfile import Initializer, field, onnx_bytes, varint
from lmzfs.testing.torture import Case, Outcome
from lmzfs.testing.torture.common import exit_with_lmz, listed_models, lmz, sha

RSS_BOUND_MIB = 1536
DTYPES = ["F32", "F16", "BF16", "I8", "U8", "I16", "I32", "I64", "F64", "BOOL", "F8_E4M3", "Q4", "", "f32"]


def _lie(rng: random.Random) -> int:
    return rng.choice([0, 1, -1, 2 ** 31, 2 ** 32 - 1, 2 ** 63 - 1, 2 ** 64 - 1, rng.randrange(1 << 40), 65537])


def safetensors_file(rng: random.Random) -> bytes:
    hostile = rng.random() < 0.5
    header, at, blobs = {}, 0, []
    for i in range(rng.randrange(0, 12)):
        dtype = rng.choice(DTYPES if hostile else DTYPES[:9])
        shape = [rng.randrange(0, 24) for _ in range(rng.randrange(0, 3))]
        n = int(np.prod(shape)) if shape else 1
        size = n * {"F32": 4, "F16": 2, "BF16": 2, "I16": 2, "I32": 4, "I64": 8, "F64": 8}.get(dtype, 1)
        offs = [at, at + size]
        if hostile and rng.random() < 0.4:
            shape = rng.choice([[_lie(rng)], [-3, 2], "x", None, [1.5]])
        if hostile and rng.random() < 0.4:
            offs = rng.choice([[_lie(rng), _lie(rng)], [at + size, at], [at], "0", None])
        header[f"t{i}" if rng.random() < 0.8 else "".join(chr(rng.randrange(1, 0x3000)) for _ in range(5))] = \
            {"dtype": dtype, "shape": shape, "data_offsets": offs}
        blobs.append(rng.randbytes(size))
        at += size
    if rng.random() < 0.3:
        header["__metadata__"] = {"k": "v" * rng.randrange(0, 50)} if not hostile else rng.choice([{"k": 1}, [], "x"])
    text = json.dumps(header).encode()
    hlen = len(text)
    if hostile and rng.random() < 0.2:
        hlen = _lie(rng) & (2 ** 64 - 1)
    return _mutate(rng, struct.pack("<Q", hlen) + text + b"".join(blobs), hostile)


def gguf_file(rng: random.Random) -> bytes:
    hostile = rng.random() < 0.5
    def s(raw: bytes) -> bytes:
        n = len(raw) if not (hostile and rng.random() < 0.1) else _lie(rng) & (2 ** 64 - 1)
        return struct.pack("<Q", n) + raw
    kvs = []
    for i in range(rng.randrange(0, 6)):
        t = rng.choice([4, 5, 6, 8, 9] + ([0, 13, 99] if hostile else []))
        if t == 8:
            val = s(rng.randbytes(rng.randrange(0, 20)))
        elif t == 9:
            count = rng.randrange(0, 8) if not (hostile and rng.random() < 0.3) else _lie(rng) & (2 ** 64 - 1)
            val = struct.pack("<IQ", 4, count) + b"".join(struct.pack("<I", rng.randrange(1 << 32)) for _ in range(min(count, 8)))
        elif t in (4, 5, 6):
            val = rng.randbytes(4)
        else:
            val = rng.randbytes(rng.randrange(0, 9))
        kvs.append(s(f"k{i}".encode()) + struct.pack("<I", t) + val)
    infos, at = [], 0
    for i in range(rng.randrange(0, 6)):
        dims = [rng.randrange(1, 16) for _ in range(rng.randrange(1, 3))]
        if hostile and rng.random() < 0.3:
            dims = [_lie(rng) & (2 ** 64 - 1) for _ in range(rng.randrange(0, 5))]
        gtype = rng.choice([0, 1] + ([2, 8, 12, 14, 99, 1000] if hostile else []))
        off = at if not (hostile and rng.random() < 0.2) else _lie(rng) & (2 ** 64 - 1)
        infos.append(s(f"w{i}".encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", gtype, off))
        at += -(-int(np.prod(dims[:2] or [1])) * 4 // 32) * 32 if not hostile else 64
    n_t, n_kv = len(infos), len(kvs)
    if hostile and rng.random() < 0.2:
        n_t, n_kv = _lie(rng) & (2 ** 64 - 1), rng.choice([n_kv, _lie(rng) & (2 ** 64 - 1)])
    head = b"GGUF" + struct.pack("<IQQ", rng.choice([3, 3, 2, 1, 4]) if hostile else 3, n_t, n_kv) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % 32)
    return _mutate(rng, head + rng.randbytes(min(at, 1 << 16)), hostile)


def onnx_file(rng: random.Random) -> bytes:
    hostile = rng.random() < 0.5
    inits = [Initializer(f"i{i}", np.asarray(np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
        rng.randrange(1, 300)), dtype=rng.choice(["float32", "float16", "int8"]) if True else None))
        for i in range(rng.randrange(0, 5))]
    data = onnx_bytes(inits, nodes=rng.randrange(0, 4))
    if hostile and rng.random() < 0.4:      # a field claiming more than the file holds
        data += field(7, b"") [:1] + varint(_lie(rng) & (2 ** 63 - 1)) + rng.randbytes(rng.randrange(0, 40))
    return _mutate(rng, data, hostile)


def zip_file(rng: random.Random) -> bytes:
    hostile = rng.random() < 0.5
    buf = io.BytesIO()
    import warnings
    warnings.filterwarnings("ignore", "Duplicate name", UserWarning)
    with zipfile.ZipFile(buf, "w", compression=rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])) as z:
        import pickle
        z.writestr("archive/data.pkl", pickle.dumps({"w": list(range(rng.randrange(0, 20)))}, protocol=rng.choice([2, 4, 5])))
        for i in range(rng.randrange(0, 5)):
            name = f"archive/data/{i}" if not (hostile and rng.random() < 0.3) else rng.choice(["../../x", "/abs", "a\\b", "c:x", "\x1b[31m"])
            z.writestr(name, rng.randbytes(rng.randrange(0, 3000)))
        z.writestr("archive/version", b"3\n")
    return _mutate(rng, buf.getvalue(), hostile)


def _mutate(rng: random.Random, data: bytes, hostile: bool) -> bytes:
    if not hostile or not data:
        return data
    b = bytearray(data)
    for _ in range(rng.randrange(0, 6)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    if rng.random() < 0.25:
        del b[rng.randrange(len(b) + 1):]
    return bytes(b)


GENERATORS = {"safetensors": (safetensors_file, ".safetensors"), "gguf": (gguf_file, ".gguf"),
              "onnx": (onnx_file, ".onnx"), "zip": (zip_file, ".pt")}


def _one_line_refusal(out: Outcome, r, what: str) -> None:
    if r.any_traceback:
        out.traceback = out.traceback or r.any_traceback[-3000:]
    elif r.rc != 0:
        lines = r.stderr.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("lmz: "):
            out.problems.append(f"{what}: rc={r.rc}, not one lmz: line: {r.stderr[-300:]!r}")


def headers_case(scratch: Path, seed: int, per_format: int) -> Outcome:
    rng = random.Random(seed)
    store, src = scratch / "store", scratch / "in"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    files = {}
    for fmt, (gen, ext) in GENERATORS.items():
        for i in range(per_format):
            data = gen(rng)
            name = f"{fmt}-{i}{ext}"
            (src / name).write_bytes(data)
            files[name] = sha(data)
    out = Outcome(f"headers seed={seed}", items=len(files))
    r = lmz(store, "add", str(src), "--name", "h")
    _one_line_refusal(out, r, "add")
    if r.rc == 0:
        for name, digest in files.items():
            got = lmz(store, "cat", f"h/{name}")
            if got.any_traceback:
                out.traceback = out.traceback or got.any_traceback[-3000:]
            if got.rc != 0:
                out.problems.append(f"h/{name} stored but unreadable: {got.stderr.strip()[-200:]}")
            elif sha(got.stdout) != digest:
                out.wrong_bytes += 1
                out.info.setdefault("wrong", []).append(name)
        for name in list(files)[:: max(1, len(files) // 8)]:        # inspect too: bounded, one line
            ins = lmz(store, "inspect", str(src / name))
            if ins.any_traceback:
                out.traceback = out.traceback or ins.any_traceback[-3000:]
    else:
        out.problems.append(f"a batch of generated headers was refused: {r.stderr.strip()[-200:]}")
    return out


SWAPS = ("symlink-out", "symlink-in", "fifo", "other-file", "dir")


def swap_case(prep, scratch: Path, swap: str, delay: float) -> Outcome:
    """`lmz add` of a directory in a forked child while its model file is replaced."""
    store, src = scratch / "store", scratch / "in"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(prep.sources["quire"], src)
    target = src / "model.safetensors"
    original = target.read_bytes()
    other = bytes(reversed(original[: len(original) // 2]))
    out = Outcome(f"swap {swap} +{delay:.3f}s")
    errf = scratch / "add.err"
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(errf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            import sys
            sys.stderr = os.fdopen(2, "w", buffering=1)
            exit_with_lmz(store, ["add", str(src), "--name", "swapped"])
        finally:
            os._exit(71)
    time.sleep(delay)
    tmp = src / ".swap"
    if swap == "symlink-out":
        os.symlink("/etc/passwd", tmp)
    elif swap == "symlink-in":
        os.symlink("config.json", tmp)
    elif swap == "fifo":
        os.mkfifo(tmp)
    elif swap == "other-file":
        tmp.write_bytes(other)
    else:
        tmp.mkdir()
    if swap == "dir":
        target.unlink()
        os.rename(tmp, target)
    else:
        os.replace(tmp, target)
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        out.hang = True
        out.problems.append("the add did not end within 60 s")
        return out
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    err = errf.read_text(errors="replace")
    from lmzfs.testing.torture.common import Ran
    _one_line_refusal(out, Ran((), rc, b"", err, None), "add")
    out.info["stored" if rc == 0 else "refused"] = 1
    models = listed_models(store) or set()
    if rc == 0:
        allowed = {sha(original), sha(other), sha((src / "config.json").read_bytes())}
        got = lmz(store, "cat", "swapped/model.safetensors")
        if got.rc == 0 and sha(got.stdout) not in allowed:
            out.wrong_bytes += 1
            out.info["got"] = f"{len(got.stdout)} bytes not the file's (/etc/passwd: {got.stdout.startswith(b'root:')})"
        elif got.rc != 0 and not (swap == "dir" and "no such file" in got.stderr):
            out.problems.append(f"stored but unreadable: {got.stderr.strip()[-200:]}")
    elif "swapped" in models:
        out.problems.append("the add was refused but its model is visible")
    return out


NAMES = ["..", ".", "/abs", "a/../b", "a//b", "a/", "\x1b[31mred", "a\u202eb", "a\nb", "a\u2028b", "", " ",
         "x" * 300, "a\x00b", "-rf", "--store", "ok/../../x", "a\\b", "é/ü", "\udcff", "con", "a\tb", "\x7f", "\u0085"]


def names_case(prep, scratch: Path, names: list[str]) -> Outcome:
    store = scratch / "store"
    shutil.rmtree(store, ignore_errors=True)
    out = Outcome(f"names {len(names)}", items=len(names))
    src = prep.sources["run/step-0"]
    for name in names:
        try:
            r = lmz(store, "add", str(src), f"--name={name}")
        except Exception as exc:    # noqa: BLE001 -- e.g. a surrogate the capture cannot encode
            out.problems.append(f"name {name!r}: {type(exc).__name__}: {exc}")
            continue
        _one_line_refusal(out, r, f"add --name {name!r}")
        if r.rc == 0:
            if name in ("..", ".", "/abs", "a/../b", "ok/../../x") or any(c in name for c in "\x1b\n\x00\u202e\u2028\x7f"):
                out.problems.append(f"the name {name!r} was accepted")
            ls = lmz(store, "ls", "--json")
            if ls.any_traceback:
                out.traceback = out.traceback or ls.any_traceback
            rm = lmz(store, "rm", "--", name)
            _one_line_refusal(out, rm, f"rm {name!r}")
    return out


def cases(prep, scratch: Path, rng: random.Random, sample: bool) -> Iterator[Case]:
    per = 5 if sample else 25
    yield Case("names", lambda: names_case(prep, scratch, NAMES), 120)
    for swap in SWAPS:
        d = rng.uniform(0, 0.15)
        yield Case(f"swap {swap}", lambda s=swap, d=d: swap_case(prep, scratch, s, d), 90)
    n = 2 if sample else None
    i = 0
    while n is None or i < n:
        seed = rng.randrange(1 << 30)
        yield Case("headers", lambda s=seed: headers_case(scratch, s, per), 120)
        i += 1
        if not sample and i % 20 == 0:
            for swap in SWAPS:
                d = rng.uniform(0, 0.15)
                yield Case(f"swap {swap}", lambda s=swap, d=d: swap_case(prep, scratch, s, d), 90)
