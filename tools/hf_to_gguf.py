#!/usr/bin/env python3
"""Write a Qwen3-MoE or dense Qwen3 Hugging Face checkpoint as an F16 GGUF for llama.cpp.

Used by bench/vs_llama_cpp.py to run llama.cpp on the same weights q3moe runs. llama.cpp's own
convert_hf_to_gguf.py needs the transformers package, which Debian does not ship; this needs only
numpy and llama.cpp's gguf-py (its source tree's gguf-py folder, passed with --gguf-py). It streams
tensor by tensor (one layer's stacked experts at most in memory), writes FILE.tmp and renames it.

Tensors: matrices and the embedding F16, norms and the router F32, as llama.cpp's converter writes
them for --outtype f16. The tokenizer goes in as its converter's "gpt2"/"qwen2" BPE vocabulary.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def fail(msg):
    print(f"hf_to_gguf: {msg}", file=sys.stderr)
    sys.exit(1)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def index_safetensors(d):
    """name -> (file, dtype, shape, byte offset) over every *.safetensors file of d."""
    index = {}
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        fail(f"{d}: no *.safetensors files")
    for fn in files:
        path = os.path.join(d, fn)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                fail(f"{path}: too short for a safetensors header")
            n = struct.unpack("<Q", raw)[0]
            try:
                hdr = json.loads(f.read(n))
            except ValueError as e:
                fail(f"{path}: bad safetensors header: {e}")
        for k, v in hdr.items():
            if k != "__metadata__":
                index[k] = (path, v["dtype"], v["shape"], 8 + n + v["data_offsets"][0])
    return index


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="checkpoint directory (config.json, tokenizer.json, *.safetensors)")
    ap.add_argument("out", help="the .gguf to write")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--force", action="store_true", help="replace an existing OUT")
    args = ap.parse_args()

    if os.path.exists(args.out) and not args.force:
        fail(f"{args.out} exists (--force replaces it)")
    if not os.path.isfile(os.path.join(args.gguf_py, "gguf", "__init__.py")):
        fail(f"--gguf-py {args.gguf_py}: not a gguf-py folder (no gguf/__init__.py)")
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402

    d = args.model_dir
    cfg = read_json(os.path.join(d, "config.json"))
    mtype = cfg.get("model_type")
    if mtype not in ("qwen3_moe", "qwen3"):
        fail(f"{d}/config.json: model_type {mtype!r}: only qwen3_moe and qwen3 are written")
    moe = mtype == "qwen3_moe"
    if moe and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        fail(f"{d}/config.json: mlp_only_layers or decoder_sparse_step make dense layers; "
             "llama.cpp's qwen3moe has none")
    index = index_safetensors(d)

    def shape_of(name):
        if name not in index:
            fail(f"{d}: tensor {name} not found in the *.safetensors files")
        return index[name][2]

    def load(name, dtype):  # every name was checked by shape_of when the plan was made
        path, dt, shape, off = index[name]
        count = int(np.prod(shape))
        if dt == "BF16":
            u = np.fromfile(path, dtype=np.uint16, count=count, offset=off)
            a = (u.astype(np.uint32) << 16).view(np.float32)
        elif dt == "F32":
            a = np.fromfile(path, dtype=np.float32, count=count, offset=off)
        elif dt == "F16":
            a = np.fromfile(path, dtype=np.float16, count=count, offset=off).astype(np.float32)
        else:
            fail(f"{path}: tensor {name}: dtype {dt} (BF16, F16 and F32 are read)")
        if a.size != count:
            fail(f"{path}: tensor {name}: file ends inside its data")
        return a.reshape(shape).astype(dtype)

    plan = []  # (gguf name, shape, dtype, producer)

    def add(gname, hf, dtype):
        plan.append((gname, shape_of(hf), dtype, lambda: load(hf, dtype)))

    L = cfg["num_hidden_layers"]
    add("token_embd.weight", "model.embed_tokens.weight", np.float16)
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", np.float32)
        for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            add(b + g + ".weight", p + f"self_attn.{hf}.weight", np.float16)
        add(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", np.float32)
        add(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", np.float32)
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", np.float32)
        parts = (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down"))
        if not moe:
            for hf, g in parts:
                add(b + g + ".weight", p + f"mlp.{hf}.weight", np.float16)
            continue
        add(b + "ffn_gate_inp.weight", p + "mlp.gate.weight", np.float32)
        E = cfg["num_experts"]
        for hf, g in parts:
            names = [p + f"mlp.experts.{e}.{hf}.weight" for e in range(E)]
            shape = [shape_of(n) for n in names][0]
            # llama.cpp keeps a layer's experts as one 3-D tensor, expert-major
            plan.append((b + g + "_exps.weight", [E] + shape, np.float16,
                         lambda names=names: np.stack([load(n, np.float16) for n in names])))
    add("output_norm.weight", "model.norm.weight", np.float32)
    if "lm_head.weight" in index and not cfg.get("tie_word_embeddings", False):
        add("output.weight", "lm_head.weight", np.float16)  # tied models: llama.cpp reuses token_embd

    arch = "qwen3moe" if moe else "qwen3"
    tmp = args.out + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(os.path.basename(os.path.normpath(d)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.get("rope_theta", 1000000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if moe:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])

    tok = read_json(os.path.join(d, "tokenizer.json"))
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        fail(f"{d}/tokenizer.json: model type {model.get('type')!r}, a BPE tokenizer was expected")
    V = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(V)]  # ids the tokenizer leaves unnamed, as llama.cpp's converter pads
    types = [gguf.TokenType.UNUSED] * V
    for t, i in model["vocab"].items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tok.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    # Qwen3's ids (those of the token list above) where config.json has none
    bos = cfg.get("bos_token_id")
    bos = 151643 if bos is None else bos
    eos = cfg.get("eos_token_id")
    eos = 151645 if eos is None else eos[0] if isinstance(eos, list) else eos
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(bos)
    w.add_add_bos_token(False)

    for gname, shape, dt, _ in plan:
        w.add_tensor_info(gname, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        tty = sys.stderr.isatty()
        for k, (gname, _, _, make) in enumerate(plan):
            w.write_tensor_data(make())
            if tty:
                print(f"\rhf_to_gguf: {k + 1}/{len(plan)} tensors ({gname})\033[K", end="", file=sys.stderr, flush=True)
        w.close()
    except BaseException:
        w.close()
        os.unlink(tmp)
        raise
    if tty:
        print(file=sys.stderr)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
