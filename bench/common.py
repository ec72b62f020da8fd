"""What every benchmark module shares: running commands, reading files, mounting, samples, the machine.

Runs under bench/.venv's python and never imports lmzfs: our CLI is driven as a command
(.venv/bin/lmz), and the corpus is fetched by a subprocess of the project's .venv/bin/python.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

REPO = Path(__file__).resolve().parent.parent
LMZFS_PY = Path(os.environ.get("LMZFS_PYTHON", REPO / ".venv" / "bin" / "python"))
# Our CLI. run.py replaces it with a frozen copy of lmzfs/ (freeze_lmzfs) unless $LMZFS_CLI is set;
# read it as common.LMZFS_CLI at call time, never bind it at import.
LMZFS_CLI = Path(os.environ.get("LMZFS_CLI", REPO / ".venv" / "bin" / "lmz"))
# The frozen copy's directory (PYTHONPATH for scripts that import lmzfs: codec_speed.py,
# decode_bound.py), or None: run.py sets it once the copy is made.
LMZFS_FROZEN: Path | None = None
LMZIP_CLI = Path(sys.prefix) / "bin" / "lmz"   # lmzip's `lmz`, from the venv running the bench
READ_SIZE = 1 << 20                              # sequential reads of 1 MiB
MOUNT_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 1800


class ToolError(RuntimeError):
    """A tool could not do what was asked; the message says why."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def describe(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text if isinstance(exc, ToolError) else f"{type(exc).__name__}: {text}"


def run(argv: list, *, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run a command; return its stdout, or raise ToolError with the tail of its stderr."""
    argv = [str(a) for a in argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ToolError(f"{argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(argv)} took more than {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-400:]
        shown = " ".join(Path(a).name if a.startswith("/") else a for a in argv)   # paths by name only
        raise ToolError(f"`{shown}` exited {done.returncode}: {tail}")
    return done.stdout


def help_text(argv: list) -> str | None:
    """The --help output of a (sub)command, or None when it does not exist."""
    try:
        return run([*argv, "--help"], timeout=60)
    except ToolError:
        return None


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cli_version(argv: list, prefix: str = "") -> Callable[[], str]:
    """The first line of `argv`'s output, or `prefix` plus its first dotted version number."""
    def get() -> str:
        try:
            text = run(argv, timeout=60).strip()
        except ToolError as exc:
            return f"unknown ({exc})"
        m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", text)
        return f"{prefix} {m.group(1)}" if prefix and m else (text.splitlines() or ["unknown"])[0]
    return get


def cli_startup_s(argv: list) -> float | None:
    """Best of 3: seconds a CLI takes to print its help, the fixed cost inside each of its timed runs."""
    best = None
    for _ in range(3):
        start = time.perf_counter()
        try:
            run(argv, timeout=60)
        except ToolError:
            return None
        best = min(best or 1e9, time.perf_counter() - start)
    return best


# ----------------------------------------------------------------------------- files


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_SIZE):
            h.update(block)
    return h.hexdigest()


def spool_pending(store: Path) -> int:
    """How many files a writable mount of `store` has not committed yet: its spool's records, each
    an ID.json, a used slot of records.slots or a used pair of records.pairs (docs/format.md,
    "Spool directory": in records.slots page 0 is the header, each later 4,096-byte page a slot,
    used while its first byte is not zero; in records.pairs the 4,096-byte header is followed by
    slots of two 32,768-byte halves, a slot used while either half's first 4 bytes are not zero)."""
    spool = Path(store) / "spool"
    pending = sum(1 for _ in spool.glob("*.json"))
    try:
        with open(spool / "records.slots", "rb") as f:
            f.seek(4096)
            while page := f.read(4096):
                pending += page[0] != 0
    except FileNotFoundError:
        pass
    try:
        with open(spool / "records.pairs", "rb") as f:
            f.seek(4096)
            while pair := f.read(65536):
                pending += any(pair[at:at + 4].strip(b"\0") for at in (0, 32768))
    except FileNotFoundError:
        pass
    return pending


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process and (summed) its live descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        if children:
            with contextlib.suppress(OSError):
                for t in Path(f"/proc/{p}/task").iterdir():
                    with contextlib.suppress(OSError):
                        todo += [int(c) for c in (t / "children").read_text().split()]
    return total


def read_sequential(path: Path) -> tuple[int, float]:
    """Read a whole file front to back in 1 MiB reads; return (bytes, seconds)."""
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    total = 0
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total, time.perf_counter() - start


def files_under(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(Path(d) / f for d, _dirs, names in os.walk(root) for f in names)


def warm_page_cache(paths: Iterable[Path]) -> int:
    """Read every file under these paths once, so that they are in the page cache; return the bytes read."""
    return sum(read_sequential(f)[0] for p in paths for f in files_under(p))


def du_bytes(root: Path) -> int:
    """Allocated bytes under root, like `du -s -B1`: blocks of every file and directory, hard links once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def link_dir(files: Iterable[Path], dest: Path) -> Path:
    """A directory holding exactly these files by name (hard-linked, copied across file systems)."""
    dest.mkdir(parents=True)
    for src in files:
        try:
            os.link(src, dest / src.name)
        except OSError:
            shutil.copyfile(src, dest / src.name)
    return dest


# ----------------------------------------------------------------------------- mounts


@dataclass
class Mount:
    path: Path
    ready_s: float
    proc: subprocess.Popen


def _unmount_lazily(mnt: Path) -> None:
    for helper in ("fusermount3", "fusermount"):
        if shutil.which(helper):
            subprocess.run([helper, "-u", "-z", str(mnt)], capture_output=True)
            return


@contextlib.contextmanager
def mounted(mount_argv: list, umount_argv: list, mnt: Path, logfile: Path) -> Iterator[Mount]:
    """Run a mount command, wait until MNT is a mount point, yield it.

    Works for servers that stay in the foreground and for ones that daemonize. The exit path
    always unmounts: the tool's own umount first, then a lazy fusermount if anything is left, and
    a foreground server that does not leave by itself is terminated (only the process started here).
    """
    mnt.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([str(a) for a in mount_argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not os.path.ismount(mnt):
            rc = proc.poll()
            if rc not in (None, 0):
                raise ToolError(f"mount exited {rc}: {logfile.read_text(errors='replace').strip()[-400:]}")
            if time.perf_counter() - start > MOUNT_TIMEOUT_S:
                raise ToolError(f"{mnt} was not mounted after {MOUNT_TIMEOUT_S} s")
            time.sleep(0.005)
        yield Mount(mnt, time.perf_counter() - start, proc)
    finally:
        with contextlib.suppress(ToolError):
            run(umount_argv, timeout=60)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(mnt):
            _unmount_lazily(mnt)


def proc_memory(pid: int, with_children: bool = True) -> dict[str, int]:
    """VmHWM and VmRSS in bytes of a process, plus (summed) those of its descendants."""
    def status(p: int) -> dict[str, int]:
        out = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                key, _, val = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(val.split()[0]) * 1024
        return out

    def children(p: int) -> list[int]:
        kids: list[int] = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    kids += [int(c) for c in (task / "children").read_text().split()]
        return kids

    own = status(pid)
    if not own:
        raise ToolError(f"no /proc/{pid}/status (the process is gone)")
    result = {"pid": pid, "vmhwm": own.get("VmHWM", 0), "vmrss": own.get("VmRSS", 0),
              "children": 0, "children_vmhwm": 0, "children_vmrss": 0}
    if with_children:
        todo, seen = children(pid), set()
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            st = status(c)
            result["children"] += 1
            result["children_vmhwm"] += st.get("VmHWM", 0)
            result["children_vmrss"] += st.get("VmRSS", 0)
            todo += children(c)
    return result


# ----------------------------------------------------------------------------- numbers


def summary(values: list[float]) -> dict | None:
    """median, min, max and the values themselves (None if there are none)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def rates(nbytes: int, seconds: list[float]) -> dict | None:
    """MB/s (decimal MB) of nbytes over each run's seconds."""
    return summary([nbytes / 1e6 / s for s in seconds if s > 0])


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        raise ValueError("no values")
    k = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[min(k, len(sorted_values) - 1)]


# ----------------------------------------------------------------------------- the machine


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    return (f"{cpu}, {os.cpu_count()} CPUs{mem}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


@dataclass
class LoadMonitor:
    """Samples the 1-minute load average every `every` seconds in a background thread."""
    every: float = 10.0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append((time.time(), os.getloadavg()[0]))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> "LoadMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), os.getloadavg()[0]))

    def result(self) -> dict:
        loads = [v for _, v in self.samples] or [os.getloadavg()[0]]
        return {"start": loads[0], "end": loads[-1], "min": min(loads), "median": statistics.median(loads),
                "max": max(loads), "samples": len(loads), "cpus": os.cpu_count()}


# ----------------------------------------------------------------------------- the code under test


def code_state(root: Path = REPO) -> dict:
    """Which lmzfs code is under `root`: the git commit, the uncommitted files under lmzfs/, and a hash
    of every .py under lmzfs/ (the working tree is shared: the report says when it changed)."""
    h = hashlib.sha256()
    for f in sorted((root / "lmzfs").rglob("*.py")):
        with contextlib.suppress(OSError):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    state = {"source": str(root), "source_sha256": h.hexdigest()[:16], "commit": None, "uncommitted": None}
    with contextlib.suppress(ToolError):
        state["commit"] = run(["git", "-C", root, "rev-parse", "--short", "HEAD"], timeout=30).strip()
        dirty = run(["git", "-C", root, "status", "--porcelain", "--", "lmzfs"], timeout=30).splitlines()
        state["uncommitted"] = len(dirty)
    return state


def lmzfs_python(frozen: Path | None) -> list[str]:
    """argv prefix that runs the project's venv Python on the lmzfs copy frozen in *frozen* (see
    freeze_lmzfs), or on the working tree when None."""
    env = ["env", f"PYTHONPATH={frozen}", "PYTHONSAFEPATH=1"] if frozen is not None else []
    return [*env, str(LMZFS_PY)]


def compile_bytecode(package: Path) -> None:
    """Write the bytecode of a copy of lmzfs, as `pip install` writes it (and lmzip's install in
    bench/.venv has): without it every command run from the copy compiles it again, where
    PYTHONDONTWRITEBYTECODE is set, and that compile is counted in whole-process times (start-up)."""
    run([LMZFS_PY, "-m", "compileall", "-q", str(package)], timeout=300)


def freeze_lmzfs(dest: Path) -> tuple[Path, dict]:
    """Copy the working tree's lmzfs/ to dest and write dest/lmz, a CLI that runs that copy with the
    project's venv (its dependencies): every command of the run, mount daemons and decoder processes
    included, then sees one version of the code even if someone edits the tree meanwhile.
    PYTHONSAFEPATH keeps the current directory (the repo, for `python -m`) off sys.path, so the copy
    on PYTHONPATH wins over the editable install; child processes inherit both. Returns (the CLI, the
    code state of what was copied)."""
    state = code_state(REPO)
    shutil.copytree(REPO / "lmzfs", dest / "lmzfs", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    copied = code_state(dest)
    if copied["source_sha256"] != state["source_sha256"]:
        raise ToolError("lmzfs/ changed while it was being copied; run again")
    compile_bytecode(dest / "lmzfs")
    cli = dest / "lmz"
    cli.write_text("#!/bin/sh\n"
                   f"# lmzfs as it was in {REPO} (commit {state['commit']}, source {state['source_sha256']}), frozen for a bench run\n"
                   f"export PYTHONPATH='{dest}'${{PYTHONPATH:+:$PYTHONPATH}}\n"
                   "export PYTHONSAFEPATH=1\n"
                   f"exec '{LMZFS_PY}' -m lmzfs \"$@\"\n")
    cli.chmod(0o755)
    probe = run([*lmzfs_python(dest), "-c",
                 "import lmzfs.cli; print(lmzfs.cli.__file__)"], timeout=60).strip()
    if not probe.startswith(str(dest)):
        raise ToolError(f"the frozen copy is not the one imported ({probe})")
    # which tANS decoder the copy runs: the compiled loop (copied with lmzfs/) or the numpy one
    state["tans_decoder"] = run([*lmzfs_python(dest), "-c",
                                 "from lmzfs.codecs.kernels import compiled; loop = compiled(); print(('compiled, ' + "
                                 "('AVX-512 steps' if loop.vector_isa() == 'avx512' else 'scalar steps')) "
                                 "if loop else 'numpy')"],
                                timeout=60).strip()
    return cli, state


# ----------------------------------------------------------------------------- the corpus


def fetch_corpus(name: str) -> Path:
    """A corpus file by name, fetched (and converted) by lmzfs.testing.corpus in the project's venv."""
    code = "import sys; from lmzfs.testing.corpus import fetch; print(fetch(sys.argv[1], quiet=False))"
    return Path(run([LMZFS_PY, "-c", code, name], timeout=3600).strip().splitlines()[-1])


def corpus_names() -> list[str]:
    code = "import json; from lmzfs.testing.corpus import CORPUS; print(json.dumps(list(CORPUS)))"
    return json.loads(run([LMZFS_PY, "-c", code], timeout=120))
