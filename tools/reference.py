#!/usr/bin/python3
"""Reference forward pass for Qwen3-MoE / Qwen3 checkpoints, in float64 numpy.

Written from the Hugging Face transformers semantics, independently of the C
engine, so the tests can compare the two. It favours clarity over speed and
is meant for small (synthesized) checkpoints.

  reference.py logits -m DIR --ids 1,2,3 -o FILE   float32 [n_ids, vocab], little-endian
  reference.py greedy -m DIR --ids 1,2,3 -n 64     JSON array of greedy next ids

Both take --ffn / --attn / --head mxfp4|mxfp8|mxint8|bf16 and
--act mxfp8|mxint8|none to emulate a quantization scheme with tools/mx_ref.py:
--ffn fake-quantizes every expert and dense-MLP gate/up/down weight, --attn
every q/k/v/o_proj weight, --head the lm_head weight (refused when it is tied
to the embeddings), row by row in 32-blocks along the input dimension (once,
at load); "bf16" keeps the weights as stored. --act mxfp8 / mxint8 also
fake-quantizes, to that format, the input of every quantized linear (q/k/v
and gate/up: the normed hidden row; o_proj: the attention output; down:
silu(gate) * up; lm_head under --head: the final-norm output). Embeddings,
norms and the router, and their inputs, are never quantized, nor is lm_head
or its input without --head. MX rounding happens in float32, as the engine
holds values; everything else stays float64.
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

import mx_ref

FAKE_QUANT = {"mxfp8": mx_ref.fake_quant_mxfp8, "mxfp4": mx_ref.fake_quant_mxfp4,
              "mxint8": mx_ref.fake_quant_mxint8}
WEIGHT_TYPES = [*FAKE_QUANT, "bf16"]  # --ffn / --attn / --head
ACT_TYPES = ["mxfp8", "mxint8", "none"]  # --act
# Which scheme group (--attn / --ffn) a weight belongs to; the router is mlp.gate.weight (no _proj).
GROUPS = [("attn", re.compile(r"\.self_attn\.[qkvo]_proj\.weight$")),
          ("ffn", re.compile(r"\.mlp\.(experts\.\d+\.)?(gate|up|down)_proj\.weight$"))]


def fake_quant(fmt, a):
    """a (float64) through MX format fmt along the last axis, in float32 semantics; float64 again."""
    return FAKE_QUANT[fmt](np.asarray(a, dtype=np.float32)).astype(np.float64)


def read_safetensors(path, out):
    """Add every tensor of one .safetensors file to `out`, as float64."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = np.asarray(data[begin:end])
        dtype = info["dtype"]
        if dtype == "F32":
            a = raw.view("<f4")
        elif dtype == "F16":
            a = raw.view("<f2")
        elif dtype == "BF16":  # bfloat16 is the top half of a float32
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            sys.exit(f"reference.py: {path}: tensor {name} has unsupported dtype {dtype}")
        out[name] = a.astype(np.float64).reshape(info["shape"])


def read_checkpoint(d):
    weights = {}
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        read_safetensors(os.path.join(d, name), weights)
    return weights


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class Model:
    def __init__(self, d, ffn="bf16", attn="bf16", act="none", head="bf16"):
        for flag, v, allowed in (("ffn", ffn, WEIGHT_TYPES), ("attn", attn, WEIGHT_TYPES),
                                 ("head", head, WEIGHT_TYPES), ("act", act, ACT_TYPES)):
            if v not in allowed:  # before the slow load; --act takes only the engine's formats (not mxfp4)
                raise ValueError(f"{flag} {v!r} is not one of {', '.join(allowed)}")
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        self.w = read_checkpoint(d)
        self.scheme = {"ffn": ffn, "attn": attn, "head": head}
        self.act = act
        for name in self.w:
            for group, pattern in GROUPS:
                if self.scheme[group] != "bf16" and pattern.search(name):
                    self.w[name] = fake_quant(self.scheme[group], self.w[name])
        self.n_layers = c["num_hidden_layers"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.n_heads
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_theta", 10000.0)
        moe = c["model_type"] == "qwen3_moe"
        self.n_experts = c.get("num_experts", 0) if moe else 0
        self.top_k = c.get("num_experts_per_tok", 0)
        self.norm_topk = c.get("norm_topk_prob", False)
        step = c.get("decoder_sparse_step", 1)
        mlp_only = set(c.get("mlp_only_layers", []))
        self.sparse = [self.n_experts > 0 and l not in mlp_only and (l + 1) % step == 0
                       for l in range(self.n_layers)]
        self.lm_head = self.w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") \
            else self.w["lm_head.weight"]
        if head != "bf16":
            if c.get("tie_word_embeddings"):
                raise ValueError("--head needs a separate lm_head.weight (the model ties it to the embeddings)")
            self.lm_head = fake_quant(head, self.lm_head)

    def linear_in(self, group, x):
        """The input of a linear of `group` as the scheme sees it (the --act format per 32-block)."""
        return fake_quant(self.act, x) if self.act != "none" and self.scheme[group] != "bf16" else x

    def new_cache(self):
        """Per-layer keys and values seen so far, each [positions, kv_heads, head_dim]."""
        empty = np.zeros((0, self.n_kv, self.head_dim))
        return [[empty, empty] for _ in range(self.n_layers)]

    def rope(self, x, pos):
        d = self.head_dim
        inv_freq = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        angle = np.outer(pos, inv_freq)
        emb = np.concatenate([angle, angle], axis=-1)[:, None, :]  # [T, 1, D]
        return x * np.cos(emb) + rotate_half(x) * np.sin(emb)

    def attention(self, l, h, cache, pos):
        w, p, T, D = self.w, f"model.layers.{l}.self_attn.", len(h), self.head_dim
        h = self.linear_in("attn", h)
        q = (h @ w[p + "q_proj.weight"].T).reshape(T, self.n_heads, D)
        k = (h @ w[p + "k_proj.weight"].T).reshape(T, self.n_kv, D)
        v = (h @ w[p + "v_proj.weight"].T).reshape(T, self.n_kv, D)
        q = self.rope(rmsnorm(q, w[p + "q_norm.weight"], self.eps), pos)
        k = self.rope(rmsnorm(k, w[p + "k_norm.weight"], self.eps), pos)
        cache[l][0] = np.concatenate([cache[l][0], k])
        cache[l][1] = np.concatenate([cache[l][1], v])
        group = self.n_heads // self.n_kv  # query head i reads kv head i // group
        keys = np.repeat(cache[l][0], group, axis=1)
        vals = np.repeat(cache[l][1], group, axis=1)
        scores = np.einsum("tqd,sqd->qts", q, keys) * D ** -0.5
        key_pos = np.arange(len(keys))
        scores = np.where(key_pos[None, None, :] > pos[None, :, None], -np.inf, scores)
        out = np.einsum("qts,sqd->tqd", softmax(scores), vals).reshape(T, -1)
        return self.linear_in("attn", out) @ w[p + "o_proj.weight"].T

    def mlp(self, prefix, h):
        w, h = self.w, self.linear_in("ffn", h)
        gate = h @ w[prefix + "gate_proj.weight"].T
        up = h @ w[prefix + "up_proj.weight"].T
        return self.linear_in("ffn", silu(gate) * up) @ w[prefix + "down_proj.weight"].T

    def moe(self, l, h):
        p = f"model.layers.{l}.mlp."
        probs = softmax(h @ self.w[p + "gate.weight"].T)  # softmax over all experts
        out = np.zeros_like(h)
        for t in range(len(h)):
            chosen = np.argsort(-probs[t], kind="stable")[: self.top_k]  # ties: lower index
            weights = probs[t, chosen]
            if self.norm_topk:
                weights = weights / weights.sum()
            for e, we in zip(chosen, weights):
                out[t] += we * self.mlp(f"{p}experts.{e}.", h[t : t + 1])[0]
        return out

    def forward(self, ids, cache):
        """Logits [len(ids), vocab] for ids following the tokens already in cache."""
        w = self.w
        pos = np.arange(len(cache[0][0]), len(cache[0][0]) + len(ids))
        x = w["model.embed_tokens.weight"][np.asarray(ids)]
        for l in range(self.n_layers):
            p = f"model.layers.{l}."
            x = x + self.attention(l, rmsnorm(x, w[p + "input_layernorm.weight"], self.eps), cache, pos)
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + (self.moe(l, h) if self.sparse[l] else self.mlp(p + "mlp.", h))
        return self.linear_in("head", rmsnorm(x, w["model.norm.weight"], self.eps)) @ self.lm_head.T

    def greedy(self, ids, n):
        cache = self.new_cache()
        logits = self.forward(ids, cache)
        out = []
        for _ in range(n):
            out.append(int(np.argmax(logits[-1])))  # argmax: lowest id wins ties
            logits = self.forward([out[-1]], cache)
        return out


def parse_ids(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits", help="write float32 logits for every position")
    gr = sub.add_parser("greedy", help="print greedy continuation ids as JSON")
    for p in (lg, gr):
        p.add_argument("-m", "--model", required=True, help="checkpoint directory")
        p.add_argument("--ids", required=True, type=parse_ids, help="comma-separated token ids")
        p.add_argument("--ffn", choices=WEIGHT_TYPES, default="bf16",
                       help="expert / dense-MLP weights (default bf16: as stored)")
        p.add_argument("--attn", choices=WEIGHT_TYPES, default="bf16",
                       help="q/k/v/o_proj weights (default bf16: as stored)")
        p.add_argument("--head", choices=WEIGHT_TYPES, default="bf16",
                       help="lm_head weight (default bf16: as stored)")
        p.add_argument("--act", choices=ACT_TYPES, default="none",
                       help="inputs of the quantized linears (default none)")
    lg.add_argument("-o", "--output", required=True, help="output file")
    gr.add_argument("-n", type=int, default=64, help="tokens to generate")
    a = ap.parse_args()

    try:
        model = Model(a.model, ffn=a.ffn, attn=a.attn, act=a.act, head=a.head)
    except ValueError as e:  # mx_ref: a dimension that is not a multiple of 32, or a non-finite weight
        sys.exit(f"reference.py: {a.model}: {e}")
    vocab = model.lm_head.shape[0]
    bad = [i for i in a.ids if not 0 <= i < vocab]
    if bad:
        sys.exit(f"reference.py: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    if a.cmd == "logits":
        model.forward(a.ids, model.new_cache()).astype("<f4").tofile(a.output)
    else:
        print(json.dumps(model.greedy(a.ids, a.n)))


if __name__ == "__main__":
    main()
