"""`q3moe synth`: file layout, safetensors headers, config.json, dtypes,
determinism, presets (via --dry-run for the big ones) and argument errors."""
import json
import os
import resource
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))

SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
         "--experts", "4", "--top-k", "2", "--moe-ffn", "32", "--ffn", "96", "--vocab", "256",
         "--tokenizer", "none"]


def synth(*args, check=True):
    p = subprocess.run([Q3MOE, "synth", *map(str, args)], capture_output=True, text=True)
    if check:
        assert p.returncode == 0, f"synth {args} failed ({p.returncode}):\n{p.stderr}"
    return p


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        text = f.read(n)
    return n, json.loads(text), text


def read_tensors(d):
    """name -> (dtype, shape, raw bytes) over all safetensors files of d."""
    out = {}
    for path in sorted(Path(d).glob("*.safetensors")):
        n, header, _ = read_header(path)
        data = path.read_bytes()[8 + n:]
        for name, info in header.items():
            if name != "__metadata__":
                b, e = info["data_offsets"]
                out[name] = (info["dtype"], info["shape"], data[b:e])
    return out


def expected_tensors(c):
    """(name, shape) of every tensor a checkpoint with config c holds."""
    H, D = c["hidden_size"], c["head_dim"]
    qd, kvd = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    t = [("model.embed_tokens.weight", [c["vocab_size"], H])]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", [H]), (p + "self_attn.q_proj.weight", [qd, H]),
              (p + "self_attn.k_proj.weight", [kvd, H]), (p + "self_attn.v_proj.weight", [kvd, H]),
              (p + "self_attn.o_proj.weight", [H, qd]), (p + "self_attn.q_norm.weight", [D]),
              (p + "self_attn.k_norm.weight", [D]), (p + "post_attention_layernorm.weight", [H])]
        E = c.get("num_experts", 0) if c["model_type"] == "qwen3_moe" else 0
        sparse = E > 0 and l not in c.get("mlp_only_layers", []) and (l + 1) % c["decoder_sparse_step"] == 0
        mlps = [(f"{p}mlp.experts.{e}.", c["moe_intermediate_size"]) for e in range(E)] if sparse \
            else [(p + "mlp.", c["intermediate_size"])]
        if sparse:
            t.append((p + "mlp.gate.weight", [E, H]))
        for pre, F in mlps:
            t += [(pre + "gate_proj.weight", [F, H]), (pre + "up_proj.weight", [F, H]),
                  (pre + "down_proj.weight", [H, F])]
    t.append(("model.norm.weight", [H]))
    if not c["tie_word_embeddings"]:
        t.append(("lm_head.weight", [c["vocab_size"], H]))
    return t


def expected_shards(sizes, limit):
    """Shards in order, a new one before a tensor that would overflow the limit."""
    shards, used = 1, 0
    for b in sizes:
        if used and used + b > limit:
            shards, used = shards + 1, 0
        used += b
    return shards


def as_f32(dtype, raw):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4")
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)


def test_single_file_layout(tmp_path):
    d = tmp_path / "m"
    synth("-o", d, *SMALL)
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
    path = d / "model.safetensors"
    n, header, text = read_header(path)
    assert n % 8 == 0 and text.startswith(b"{") and text.rstrip(b" ").endswith(b"}")
    assert header.pop("__metadata__") == {"format": "pt"}
    config = json.loads((d / "config.json").read_text())
    want = expected_tensors(config)
    assert {k: v["shape"] for k, v in header.items()} == dict(want)
    # data offsets tile the data section exactly, with the right byte sizes
    spans = sorted(v["data_offsets"] for v in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] == path.stat().st_size - 8 - n
    for v in header.values():
        assert v["dtype"] == "BF16"
        assert v["data_offsets"][1] - v["data_offsets"][0] == 2 * int(np.prod(v["shape"]))


def test_sharded_layout_and_same_values(tmp_path):
    one, many = tmp_path / "one", tmp_path / "many"
    args = SMALL + ["--layers", "4", "--experts", "16", "--seed", "5"]
    synth("-o", one, *args)
    synth("-o", many, *args, "--shard-mb", "1")
    files = sorted(f for f in os.listdir(many) if f.endswith(".safetensors"))
    assert len(files) >= 2
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    index = json.loads((many / "model.safetensors.index.json").read_text())
    tensors = read_tensors(many)
    assert set(index["weight_map"]) == set(tensors)
    for name, f in index["weight_map"].items():
        assert name in read_header(many / f)[1]
    assert index["metadata"]["total_size"] == sum(len(raw) for _, _, raw in tensors.values())
    for f in files:
        assert (many / f).stat().st_size <= (1 << 20) + 64 * 1024  # limit + header
    # values depend on seed and name only, not on how the files are cut
    assert read_tensors(one) == tensors


def test_deterministic_by_seed(tmp_path):
    synth("-o", tmp_path / "a", *SMALL, "--seed", "3")
    synth("-o", tmp_path / "b", *SMALL, "--seed", "3")
    synth("-o", tmp_path / "c", *SMALL, "--seed", "4")
    a, b, c = (read_tensors(tmp_path / x) for x in "abc")
    assert a == b
    assert all(a[k][2] != c[k][2] for k in a)


def test_dtypes_and_value_ranges(tmp_path):
    for dt, tag in (("f32", "F32"), ("f16", "F16"), ("bf16", "BF16")):
        synth("-o", tmp_path / dt, *SMALL, "--dtype", dt)
        assert {v[0] for v in read_tensors(tmp_path / dt).values()} == {tag}
    synth("-o", tmp_path / "mixed", *SMALL, "--dtype", "mixed")
    mixed = read_tensors(tmp_path / "mixed")
    for name, (dtype, shape, raw) in mixed.items():
        want = "F32" if len(shape) == 1 else "F16" if ".self_attn." in name else "BF16"
        assert dtype == want, name
        v = as_f32(dtype, raw)
        assert np.isfinite(v).all(), name
        if len(shape) == 1:  # RMSNorm weights: near one, never all ones
            assert abs(v.mean() - 1) < 0.1 and 0.02 < v.std() < 0.3, name
        else:
            assert abs(v.mean()) < 0.2 and v.std() > 0.01, name
    # the same seed gives the same values in every dtype, up to rounding
    f32 = read_tensors(tmp_path / "f32")
    for name, (dtype, _, raw) in mixed.items():
        assert np.allclose(as_f32(dtype, raw), as_f32("F32", f32[name][2]), rtol=1e-2, atol=1e-6), name


def test_config_moe_small(tmp_path):
    d = tmp_path / "m"
    synth("-o", d, *SMALL, "--mlp-only-layers", "0", "--sparse-step", "1", "--norm-topk", "0",
          "--tie", "1", "--dtype", "f16")
    c = json.loads((d / "config.json").read_text())
    assert c["architectures"] == ["Qwen3MoeForCausalLM"] and c["model_type"] == "qwen3_moe"
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["head_dim"], c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"],
            c["intermediate_size"], c["vocab_size"]) == (2, 64, 4, 2, 32, 4, 2, 32, 96, 256)
    assert c["mlp_only_layers"] == [0] and c["norm_topk_prob"] is False and c["tie_word_embeddings"] is True
    assert c["torch_dtype"] == "float16"
    assert "lm_head.weight" not in read_tensors(d)


PRESETS = {
    "tiny": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
                 vocab_size=151936),
    "qwen3-30b-a3b": dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768, intermediate_size=6144, vocab_size=151936,
                          rope_theta=1e6, max_position_embeddings=40960, norm_topk_prob=True,
                          tie_word_embeddings=False),
    "qwen3-235b-a22b": dict(num_hidden_layers=94, hidden_size=4096, num_attention_heads=64,
                            num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                            moe_intermediate_size=1536, intermediate_size=12288, vocab_size=151936,
                            rope_theta=1e6, max_position_embeddings=40960, norm_topk_prob=True,
                            tie_word_embeddings=False),
}

COMMON = dict(hidden_act="silu", rms_norm_eps=1e-6, rope_scaling=None, attention_bias=False,
              attention_dropout=0.0, use_sliding_window=False, sliding_window=None, bos_token_id=151643,
              eos_token_id=151645, torch_dtype="bfloat16", use_cache=True)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_dry_run(preset, tmp_path):
    d = tmp_path / preset
    p = synth("-o", d, "--preset", preset, "--dry-run")
    assert os.listdir(d) == ["config.json"]
    c = json.loads((d / "config.json").read_text())
    assert c["architectures"] == ["Qwen3MoeForCausalLM"] and c["model_type"] == "qwen3_moe"
    for k, v in {**PRESETS[preset], **COMMON}.items():
        assert c[k] == v, k
    assert c["mlp_only_layers"] == [] and c["decoder_sparse_step"] == 1
    assert c["max_window_layers"] == c["num_hidden_layers"] and "transformers_version" in c
    plan = json.loads(p.stdout)
    want = expected_tensors(c)
    assert plan["tensors"] == len(want)
    assert plan["total_bytes"] == sum(2 * int(np.prod(s)) for _, s in want)
    assert plan["shards"] == expected_shards([2 * int(np.prod(s)) for _, s in want], 4096 << 20)
    if preset == "qwen3-30b-a3b":
        assert plan["tensors"] == 18867 and 60e9 < plan["total_bytes"] < 62e9  # ~30.5B params


def test_dense_preset_config(tmp_path):
    d = tmp_path / "dense"
    synth("-o", d, "--preset", "tiny-dense", "--dry-run")
    c = json.loads((d / "config.json").read_text())
    assert c["architectures"] == ["Qwen3ForCausalLM"] and c["model_type"] == "qwen3"
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
              "norm_topk_prob", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits"):
        assert k not in c
    assert c["intermediate_size"] == 512 and c["hidden_size"] == 256
    for k, v in COMMON.items():
        assert c[k] == v, k


def test_flags_override_preset(tmp_path):
    d = tmp_path / "o"
    synth("-o", d, "--preset", "qwen3-30b-a3b", "--layers", "3", "--experts", "0", "--vocab", "1000",
          "--rope-theta", "5e5", "--dry-run")
    c = json.loads((d / "config.json").read_text())
    assert c["model_type"] == "qwen3" and c["num_hidden_layers"] == 3 and c["vocab_size"] == 1000
    assert c["rope_theta"] == 5e5 and c["hidden_size"] == 2048


def test_refuses_non_empty_dir(tmp_path):
    d = tmp_path / "busy"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    p = synth("-o", d, *SMALL, check=False)
    assert p.returncode != 0 and "--force" in p.stderr and "q3moe synth: error" in p.stderr
    assert os.listdir(d) == ["notes.txt"]
    # --force writes, keeps unrelated files, and drops stale shards
    synth("-o", d, *SMALL, "--shard-mb", "1", "--layers", "4", "--experts", "16", "--force")
    assert (d / "model.safetensors.index.json").exists()
    synth("-o", d, *SMALL, "--force")
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors", "notes.txt"]
    assert (d / "notes.txt").read_text() == "mine"


def test_refusal_leaves_files_alone(tmp_path):
    d = tmp_path / "user"
    d.mkdir()
    (d / "config.json").write_text("mine")
    assert synth("-o", d, *SMALL, check=False).returncode != 0
    assert os.listdir(d) == ["config.json"] and (d / "config.json").read_text() == "mine"


def test_failed_write_leaves_nothing(tmp_path):
    """A write error (here: a 1 MiB file size limit) removes the partial
    checkpoint; config.json is written last, so it never marks one."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    d = tmp_path / "f"
    p = subprocess.run([Q3MOE, "synth", "-o", d, *SMALL, "--vocab", "8192", "--shard-mb", "1"],
                       capture_output=True, text=True, preexec_fn=limit)
    assert p.returncode != 0 and "error" in p.stderr
    assert os.listdir(d) == []


@pytest.mark.parametrize("args, flag", [
    (["--heads", "6", "--kv-heads", "4"], "--kv-heads"),
    (["--top-k", "5"], "--top-k"),
    (["--layers", "0"], "--layers"),
    (["--hidden", "abc"], "--hidden"),
    (["--head-dim", "33"], "--head-dim"),
    (["--mlp-only-layers", "7"], "--mlp-only-layers"),
    (["--norm-topk", "2"], "--norm-topk"),
    (["--tie", "-1"], "--tie"),
    (["--dtype", "q4"], "--dtype"),
    (["--preset", "gpt2"], "--preset"),
    (["--shard-mb", "0"], "--shard-mb"),
    (["--sparse-step", "0"], "--sparse-step"),
    (["--vocab", "0"], "--vocab"),
    (["--ffn", "0"], "--ffn"),  # every layer sparse: config.json's intermediate_size must still load
    (["--bogus"], "--bogus"),
    (["--seed"], "--seed"),
])
def test_bad_flags_rejected(args, flag, tmp_path):
    d = tmp_path / "x"
    p = synth("-o", d, *SMALL, *args, check=False)
    assert p.returncode != 0
    assert flag in p.stderr and "error" in p.stderr, p.stderr
    assert not d.exists()


def test_missing_output_and_help():
    p = synth(check=False)
    assert p.returncode != 0 and "-o" in p.stderr
    p = synth("--help")
    assert "--preset" in p.stdout and "--dry-run" in p.stdout


def test_tokenizer_copy_and_skip(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": {}}')
    (tok / "tokenizer_config.json").write_text('{"chat_template": ""}')
    small = [a for a in SMALL if a not in ("--tokenizer", "none")]
    # a vocabulary too small for the Qwen3 tokenizer: skipped with a note
    p = synth("-o", tmp_path / "small", *small, "--tokenizer", tok)
    assert "tokenizer" in p.stderr and not (tmp_path / "small" / "tokenizer.json").exists()
    # full vocabulary: both files copied verbatim
    synth("-o", tmp_path / "big", *small, "--vocab", "151936", "--tie", "1", "--tokenizer", tok)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "big" / f).read_bytes() == (tok / f).read_bytes()
    p = synth("-o", tmp_path / "none", *small, "--tokenizer", tmp_path / "missing", check=False)
    assert p.returncode != 0 and "--tokenizer" in p.stderr
