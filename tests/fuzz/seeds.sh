#!/usr/bin/env bash
# Seed corpora for the fuzz targets, made by q3moe itself: a micro MoE
# model (1 layer, hidden 64, 4 experts, vocab 64) as .q3m files of several
# schemes and as a safetensors checkpoint, config.json files, plan YAMLs.
# Usage: seeds.sh OUT_DIR (rewritten each time); $Q3MOE names the binary
# (default build/q3moe).
set -euo pipefail
cd "$(dirname "$0")/../.."
q3moe=${Q3MOE:-build/q3moe}
out=$1
rm -rf "$out"
mkdir -p "$out"/{q3m,safetensors,convert,config,plan,tokenize,tokenizer_json}
geo=(--layers 1 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --experts 4 --top-k 2 --moe-ffn 64 --vocab 64
     --tokenizer none)
for q in w4a8 w8a8i bf16 bf16p; do
    "$q3moe" synth -o "$out/q3m/micro-$q.q3m" "${geo[@]}" --quant "$q" >/dev/null 2>&1
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$q3moe" synth -o "$tmp/moe" "${geo[@]}" >/dev/null 2>&1
"$q3moe" synth -o "$tmp/dense" --preset tiny-dense --layers 1 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 \
    --ffn 64 --vocab 64 --tokenizer none --dtype mixed >/dev/null 2>&1
cp "$tmp/moe/model.safetensors" "$out/safetensors/moe.safetensors"
# convert: a scheme byte (fuzz_convert.c: 0 w4a8, 2 w4a8i, 6 bf16, 7 bf16p), then the file.
for s in 0 2 6 7; do
    { printf "\\$(printf %03o "$s")"; cat "$tmp/moe/model.safetensors"; } >"$out/convert/moe-$s.bin"
done
cp "$tmp/moe/config.json" "$out/config/moe.json"
cp "$tmp/dense/config.json" "$out/config/dense.json"
printf 'model_path: /models/q\nparallel_config:\n  attn_tp_size: 2\n  moe_tp_size: 1\n  moe_ep_size: 2\n' \
    >"$out/plan/ep.yaml"
printf 'parallel_config:\n  attn_tp_size: 4\n  moe_tp_size: 4\n  lmhead_tp_size: 2\n  moe_ep_comm: alltoall\n  comm_quant: mxfp8\n' \
    >"$out/plan/tp.yaml"
# Prompt texts: the tokenizer test corpus, one JSON string per line, and
# the chat template's special tokens.
python3 - "$out/tokenize" <<'PY'
import json, sys
for i, line in enumerate(open("tests/data/tokenizer_corpus.jsonl", encoding="utf-8")):
    if line.strip():
        open(f"{sys.argv[1]}/corpus-{i:03d}.txt", "w", encoding="utf-8").write(json.loads(line))
open(f"{sys.argv[1]}/chat.txt", "w").write("<|im_start|>user\nHi <think>\n\n</think> there<|im_end|>\n")
PY
# A small tokenizer.json: the real one's settings, its first 600 vocab
# entries (the 256 byte symbols among them), the merges among those, and
# its added tokens renumbered after them.
python3 - build/tokenizer/tokenizer.json "$out/tokenizer_json/small.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
m = t["model"]
m["vocab"] = {k: v for k, v in m["vocab"].items() if v < 600}
m["merges"] = [p for p in m["merges"] if p[0] in m["vocab"] and p[1] in m["vocab"] and p[0] + p[1] in m["vocab"]]
for i, a in enumerate(t["added_tokens"]):
    a["id"] = 600 + i
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False, indent=1)
PY
echo "fuzz seeds in $out: $(find "$out" -type f | wc -l) files" >&2
