"""access: the modes of every store file (0600) and directory (0700) after adds, a writable
mount's spool, a repair and gc; and (as root) that another user (nobody) cannot read the store
directly, nor the mount without --allow-other, and reads it byte for byte with it."""
from __future__ import annotations

import json
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from lmzfs.testing.torture import Case, Outcome
from lmzfs.testing.torture.common import fresh_copy, lmz, sha, unmount_quietly

NOBODY = 65534


def modes_case(prep, scratch: Path) -> Outcome:
    out = Outcome("modes")
    repaired = fresh_copy(prep.store, scratch / "repaired")
    with open(repaired / "catalog.sqlite", "r+b") as f:
        f.write(bytes(4096))
    for argv in (["verify", "--repair"], ["gc"], ["add", str(prep.sources["newcomer"]), "--name", "newcomer"],
                 ["rewrite", "compact", "--all"]):
        r = lmz(repaired, *argv)
        if r.any_traceback:
            out.traceback = r.any_traceback[-3000:]
    n = 0
    for store in (prep.store, prep.spool_store, repaired):
        for dirpath, dirnames, filenames in os.walk(store):
            for name in dirnames + filenames + ([""] if Path(dirpath) == store else []):
                p = Path(dirpath) / name
                st = p.lstat()
                want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
                n += 1
                if stat.S_IMODE(st.st_mode) != want:
                    out.problems.append(f"{p.relative_to(store.parent)}: mode {stat.S_IMODE(st.st_mode):o}, not {want:o}")
    out.items = n
    return out


def as_nobody(fn: Callable[[], dict]) -> dict:
    """Run fn in a forked child as uid/gid nobody; its dict comes back as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            res = fn()
        except BaseException as exc:     # noqa: B036
            res = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")


def _try_read_all(root: Path) -> dict:
    readable, denied, other = [], 0, []
    paths = [root] + [Path(d) / n for d, ds, fs in os.walk(root) for n in ds + fs]
    for p in paths:
        try:
            if p.is_dir():
                os.listdir(p)
            else:
                with open(p, "rb") as f:
                    f.read(1)
            readable.append(str(p))
        except PermissionError:
            denied += 1
        except OSError as exc:
            other.append(f"{p}: {exc}")
    return {"readable": readable, "denied": denied, "other": other}


def other_user_case(prep, scratch: Path) -> Outcome:
    out = Outcome("other users")
    if os.geteuid() != 0:
        out.items = 0
        out.info["skipped (not root)"] = 1
        return out
    from lmzfs.testing.mount import mounted
    # a world-traversable place, so that only the store's own modes stand in nobody's way
    top = Path(tempfile.mkdtemp(prefix="lmz-torture-access-"))
    try:
        os.chmod(top, 0o755)
        store = fresh_copy(prep.store, top / "store")
        res = as_nobody(lambda: _try_read_all(store))
        out.items = 1
        # nobody may see that the store directory exists; nothing inside
        inside = [p for p in res.get("readable", []) if Path(p) != store]
        if inside or res.get("error") or (store.stat().st_mode & 0o077):
            out.problems.append(f"nobody read the store directly: {inside[:5]} {res.get('error', '')}")
        key, digest = "minilm/model.safetensors", prep.expected["minilm/model.safetensors"]
        mnt = top / "mnt"
        mnt.mkdir()
        os.chmod(mnt, 0o755)
        for allow in (False, True):
            args = ("--allow-other",) if allow else ()
            try:
                with mounted(mnt, store, *args, timeout=30):
                    f = mnt / key

                    def probe() -> dict:
                        try:
                            return {"sha": sha(f.read_bytes())}
                        except OSError as exc:
                            return {"errno": exc.errno, "error": exc.strerror}
                    res = as_nobody(probe)
                    own = sha(f.read_bytes())
            finally:
                unmount_quietly(mnt)
            out.items += 1
            out.wrong_bytes += own != digest
            if allow:
                if res.get("sha") != digest:
                    if "sha" in res:
                        out.wrong_bytes += 1
                    out.problems.append(f"with --allow-other nobody could not read {key}: {res}")
            elif "sha" in res:
                out.problems.append("without --allow-other nobody read the mount")
            out.info["nobody with allow_other" if allow else "nobody without"] = 0 if "sha" not in res else 1
    finally:
        unmount_quietly(top / "mnt")
        shutil.rmtree(top, ignore_errors=True)
    return out


def cases(prep, scratch: Path, rng: random.Random, sample: bool) -> Iterator[Case]:
    yield Case("modes", lambda: modes_case(prep, scratch), 120)
    yield Case("other users", lambda: other_user_case(prep, scratch), 120)
