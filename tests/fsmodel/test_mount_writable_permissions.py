"""Other users on a writable mount served with --allow-other get the error codes ext4 gives them:
the same calls, as the same two unprivileged users, in a sticky shared directory and a private one,
run once in a directory of the local file system and once inside a model of the mount, must end the
same way, errno for errno (every mount is unmounted, even on failure)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lmzfs.admin.verify import verify_store
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted

OWNER, OTHER, GROUP = 2001, 2002, 2000      # no passwd entries needed: setuid takes numbers

# Run as a user inside ROOT: each step is (name, call); the result is 0 or the errno it raised.
AS_USER = r"""
import json, os, sys
root, role = sys.argv[1], sys.argv[2]
shared, private = os.path.join(root, "shared"), os.path.join(root, "private")

def attempt(call):
    try:
        call()
        return 0
    except OSError as e:
        return e.errno

def write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
    fd = os.open(path, flags, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)

def read(path):
    with open(path, "rb") as f:
        got = f.read()
    if got != b"owner's bytes\n":
        raise OSError(0, "wrong bytes: %r" % got)

steps = {
    "owner": [
        ("create in the sticky directory", lambda: write(shared + "/a", b"owner's bytes\n")),
        ("create a private file", lambda: write(private + "/secret", b"owner's bytes\n", mode=0o600)),
        ("chmod own private file", lambda: os.chmod(private + "/secret", 0o600)),
    ],
    "other": [
        ("read a 0644 file of another user", lambda: read(shared + "/a")),
        ("open for writing a 0644 file of another user", lambda: write(shared + "/a", b"x", os.O_WRONLY)),
        ("truncate a 0644 file of another user", lambda: os.truncate(shared + "/a", 0)),
        ("read a 0600 file of another user", lambda: read(private + "/secret")),
        ("list a 0755 directory of another user", lambda: os.listdir(private)),
        ("create in a 0755 directory of another user", lambda: write(private + "/mine", b"x")),
        ("mkdir in a 0755 directory of another user", lambda: os.mkdir(private + "/d")),
        ("unlink another user's file in a sticky directory", lambda: os.unlink(shared + "/a")),
        ("rename another user's file in a sticky directory", lambda: os.rename(shared + "/a", shared + "/b")),
        ("create an own file in the sticky directory", lambda: write(shared + "/c", b"other's bytes\n")),
        ("rename an own file over another user's in a sticky directory",
         lambda: os.rename(shared + "/c", shared + "/a")),
        ("unlink an own file in a sticky directory", lambda: os.unlink(shared + "/c")),
        ("chmod another user's file", lambda: os.chmod(shared + "/a", 0o666)),
        ("chown another user's file to oneself", lambda: os.chown(shared + "/a", os.getuid(), -1)),
        ("set explicit times on another user's file", lambda: os.utime(shared + "/a", (1, 1))),
        ("touch another user's 0644 file", lambda: os.utime(shared + "/a")),
        ("set a user xattr on another user's 0644 file",
         lambda: os.setxattr(shared + "/a", "user.k", b"v")),
        ("remove another user's directory tree entry", lambda: os.rmdir(private)),
    ],
    "owner again": [
        ("unlink own file in the sticky directory", lambda: os.unlink(shared + "/a")),
        ("chown own file to another user", lambda: os.chown(private + "/secret", 2002, -1)),
    ],
}[role]
print(json.dumps({name: attempt(call) for name, call in steps}))
"""

# What ext4 answers (and so what the mount must): EACCES for permission bits, EPERM for ownership
# and the sticky bit.
EXPECTED = {
    "create in the sticky directory": 0, "create a private file": 0, "chmod own private file": 0,
    "read a 0644 file of another user": 0, "open for writing a 0644 file of another user": 13,
    "truncate a 0644 file of another user": 13, "read a 0600 file of another user": 13,
    "list a 0755 directory of another user": 0, "create in a 0755 directory of another user": 13,
    "mkdir in a 0755 directory of another user": 13,
    "unlink another user's file in a sticky directory": 1,
    "rename another user's file in a sticky directory": 1,
    "create an own file in the sticky directory": 0,
    "rename an own file over another user's in a sticky directory": 1,
    "unlink an own file in a sticky directory": 0, "chmod another user's file": 1,
    "chown another user's file to oneself": 1, "set explicit times on another user's file": 1,
    "touch another user's 0644 file": 13, "set a user xattr on another user's 0644 file": 13,
    "remove another user's directory tree entry": 13,
    "unlink own file in the sticky directory": 0, "chown own file to another user": 1,
}


def python_for_others() -> str:
    """A Python another user may run (the venv's may live under root's 0700 home)."""
    for candidate in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        try:
            if candidate and subprocess.run([candidate, "-c", ""], user=OTHER, group=GROUP, extra_groups=[],
                                            capture_output=True, cwd="/").returncode == 0:
                return candidate
        except PermissionError:         # the interpreter, or a directory above it, is not for others
            continue
    pytest.fail("no Python interpreter that an unprivileged user may run (tried the venv's and /usr/bin/python3)")


def play(root: Path) -> dict[str, int]:
    """Lay out ROOT as root, then run every step as its user; the errno of each step."""
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o1777)
    (root / "private").mkdir()
    os.chown(root / "private", OWNER, GROUP)
    os.chmod(root / "private", 0o755)
    os.chmod(root, 0o755)
    results: dict[str, int] = {}
    python = python_for_others()
    for role, uid in (("owner", OWNER), ("other", OTHER), ("owner again", OWNER)):
        done = subprocess.run([python, "-c", AS_USER, str(root), role], user=uid, group=GROUP,
                              extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == 0, done.stderr
        results.update(json.loads(done.stdout))
    return results


@pytest.fixture
def open_dir():
    """A directory every user may walk into (pytest's tmp_path is 0700 root's)."""
    d = Path(tempfile.mkdtemp(prefix="lmzfs-perm-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_other_users_get_the_error_codes_ext4_gives_them_on_a_writable_mount_with_allow_other(open_dir):
    local = open_dir / "local"
    local.mkdir()
    on_disk = play(local)
    assert on_disk == EXPECTED, "the local file system itself answers differently than this test assumes"
    mnt, store = open_dir / "mnt", open_dir / "store"
    mnt.mkdir()
    with mounted(mnt, store, "--writable", "--allow-other"):
        os.chmod(mnt, 0o755)
        (mnt / "m").mkdir()
        os.chmod(mnt / "m", 0o755)
        assert play(mnt / "m") == on_disk
        assert (mnt / "m" / "private" / "secret").read_bytes() == b"owner's bytes\n"
        assert os.stat(mnt / "m" / "private" / "secret").st_uid == OWNER
        assert not (mnt / "m" / "shared" / "c").exists()
    assert verify_store(StorePaths(store)).ok
