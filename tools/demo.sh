#!/usr/bin/env bash
# `make demo`: make the default demo checkpoint (the tiny preset, random
# weights, the real Qwen3 tokenizer) once, then stream a generation from it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${Q3MOE_DEMO_MODEL:-build/demo-model}
if [ ! -f "$MODEL/config.json" ]; then
    echo "demo: writing the demo checkpoint to $MODEL (q3moe synth --preset tiny)" >&2
    build/q3moe synth -o "$MODEL" --preset tiny --seed 1
fi
[ "${1:-}" = --checkpoint-only ] && exit 0  # `make vs-llama-cpp` wants only the checkpoint
echo "demo: q3moe generate -m $MODEL --chat -p 'Tell me about mixture-of-experts models.' -n 64 --seed 42" >&2
echo "demo: (random weights, so the text is gibberish; the point is the pipeline and the speed)" >&2
build/q3moe generate -m "$MODEL" --chat -p "Tell me about mixture-of-experts models." -n 64 --seed 42 --ignore-eos
