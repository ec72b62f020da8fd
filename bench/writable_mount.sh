#!/usr/bin/env bash
# The writable mount against `lmz add`: `cp` of a corpus model into `lmz mount --writable` vs `lmz
# add` of it (stored bytes, seconds), and a 4 KiB write into the middle of the stored file (chunks
# it adds, seconds until close() returns, which is when the file is committed).
# Usage: bench/writable_mount.sh [MODEL ...]   (names under ~/.cache/lmzfs/corpus; default: minilm astra)
# Run it from outside the worktree's parent (python -m puts the cwd first on sys.path).
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
LMZ="$HERE/.venv/bin/lmz"
cd /tmp
for M in "${@:-minilm astra}"; do
  for M in $M; do
    SRC="$HOME/.cache/lmzfs/corpus/$M"
    B="$(mktemp -d /tmp/lmz-writable-bench.XXXXXX)"
    mkdir "$B/mnt"
    echo "== $M: $(du -sb "$SRC" | cut -f1) bytes"
    /usr/bin/time -f "lmz add: %e s" "$LMZ" --store "$B/add" add "$SRC" --name "$M" >/dev/null
    "$LMZ" --store "$B/mnt-store" mount --writable "$B/mnt"
    trap '"$LMZ" umount "$B/mnt" 2>/dev/null || true' EXIT
    mkdir "$B/mnt/$M"
    /usr/bin/time -f "cp into the mount: %e s" cp -r "$SRC/." "$B/mnt/$M/"
    cmp <(cat "$SRC"/*) <(cat "$B/mnt/$M"/*) && echo "same bytes back"
    echo "stored by lmz add:          $(sqlite3 "file:$B/add/catalog.sqlite?mode=ro" "SELECT SUM(length) FROM chunks") bytes"
    echo "stored via cp to the mount: $(sqlite3 "file:$B/mnt-store/catalog.sqlite?mode=ro" "SELECT SUM(length) FROM chunks") bytes"
    chunks() { sqlite3 "file:$B/mnt-store/catalog.sqlite?mode=ro" "SELECT COUNT(*) FROM chunks"; }
    before=$(chunks)
    F=$(ls "$B/mnt/$M"/* | head -1)
    python3 - "$F" <<'PY'
import os, sys, time
path = sys.argv[1]
size = os.path.getsize(path)
start = time.monotonic()
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, b"\x5a" * 4096, size // 2)
os.close(fd)
print(f"4 KiB write into the middle, close returned after {time.monotonic() - start:.2f} s")
PY
    echo "chunks that write added: $(( $(chunks) - before ))"
    "$LMZ" umount "$B/mnt"
    trap - EXIT
    "$LMZ" --store "$B/mnt-store" gc >/dev/null
    "$LMZ" --store "$B/mnt-store" verify | tail -1
    rm -rf "$B"
  done
done
