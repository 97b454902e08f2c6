"""Engine vs independent reference (tools/reference.py) on synthesized checkpoints.

Each geometry gets its own small random checkpoint from `q3moe synth`. The
engine's `q3moe logits` (whole prefill, all decode steps, and a split) must
match the float64 reference to 1e-3 relative, with the same argmax, and
`q3moe generate --temp 0` must reproduce the reference greedy ids exactly.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))
sys.path.insert(0, str(REPO / "tools"))
import reference  # noqa: E402

# Small random-weight checkpoints; each line stresses something different.
BASE = ["--layers", "3", "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "48",
        "--experts", "8", "--top-k", "3", "--moe-ffn", "64", "--ffn", "96", "--vocab", "768"]
CASES = {
    # GQA and head_dim != hidden / heads, norm_topk_prob on, untied, bf16
    "gqa_bf16": BASE + ["--dtype", "bf16", "--norm-topk", "1", "--tie", "0"],
    # plain multi-head attention, norm_topk_prob off, f32
    "mha_topk_raw_f32": BASE + ["--kv-heads", "4", "--norm-topk", "0", "--dtype", "f32"],
    # dense and sparse layers mixed (mlp_only_layers + decoder_sparse_step 2), tied, f16
    "mixed_layers_f16": BASE + ["--layers", "4", "--mlp-only-layers", "1", "--sparse-step", "2",
                                "--tie", "1", "--dtype", "f16"],
    # MoE with every dtype in one checkpoint, 4:1 GQA
    "mixed_dtype": BASE + ["--heads", "8", "--kv-heads", "2", "--head-dim", "32", "--dtype", "mixed"],
    # dense Qwen3 (model_type qwen3), tied, mixed dtypes
    "dense": ["--preset", "tiny-dense", "--layers", "3", "--hidden", "96", "--heads", "6",
              "--kv-heads", "2", "--head-dim", "32", "--ffn", "160", "--vocab", "640", "--dtype", "mixed"],
    # sharded: a 1 MiB shard limit gives several files plus the index
    "sharded": BASE + ["--layers", "4", "--experts", "16", "--top-k", "4", "--shard-mb", "1"],
}
GREEDY_CASES = ["gqa_bf16", "mixed_layers_f16", "dense"]
N_IDS = 20


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stderr}"
    return p


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """Returns a function giving the directory of a case's checkpoint (made once)."""
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    root, made = tmp_path_factory.mktemp("ckpt"), {}

    def get(case):
        if case not in made:
            d = root / case
            seed = sorted(CASES).index(case) + 7
            run([Q3MOE, "synth", "-o", d, "--tokenizer", "none", "--seed", seed] + CASES[case])
            made[case] = (d, reference.Model(str(d)))
        return made[case]

    return get


def case_ids(case, vocab):
    rng = np.random.default_rng(sorted(CASES).index(case) + 100)
    return [int(i) for i in rng.integers(0, vocab, N_IDS)]


def engine_logits(d, ids, prefill, out):
    cmd = [Q3MOE, "logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out]
    if prefill is not None:
        cmd += ["--prefill", prefill]
    run(cmd)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_reference(case, checkpoint, tmp_path):
    d, model = checkpoint(case)
    vocab = model.lm_head.shape[0]
    ids = case_ids(case, vocab)
    ref = model.forward(ids, model.new_cache())
    tol = 1e-3 * max(1.0, float(np.abs(ref).max()))
    # Where the reference's top two are closer than the tolerance, an engine
    # within tolerance may legitimately pick the other one.
    top2 = np.sort(ref, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > 2 * tol
    for prefill in (None, 1, N_IDS // 2 - 1):
        got = engine_logits(d, ids, prefill, tmp_path / f"logits_{prefill}.bin")
        assert got.shape == ref.shape
        delta = float(np.abs(got - ref).max())
        label = f"{case} prefill={prefill or 'all'}"
        print(f"{label}: max|delta| = {delta:.3g} (tolerance {tol:.3g})")
        assert delta <= tol, f"{label}: max|delta| {delta:.3g} > {tol:.3g}"
        bad = np.nonzero(decisive & (got.argmax(1) != ref.argmax(1)))[0]
        assert len(bad) == 0, f"{label}: argmax differs at positions {bad.tolist()} (max|delta| {delta:.3g})"


@pytest.mark.parametrize("case", GREEDY_CASES)
def test_greedy_matches_reference(case, checkpoint):
    d, model = checkpoint(case)
    prompt = case_ids(case, model.lm_head.shape[0])[:5]
    want = model.greedy(prompt, 64)
    p = run([Q3MOE, "generate", "-m", d, "--ids", ",".join(map(str, prompt)), "-n", 64,
             "--temp", 0, "--ignore-eos", "--print-ids"])
    got = json.loads(p.stdout.strip())
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, f"{case}: greedy ids diverge at step {first}:\nengine    {got}\nreference {want}"


def test_reference_incremental_matches_full(checkpoint):
    """The reference's KV-cache path (used by greedy) equals its full pass."""
    _, model = checkpoint("mixed_layers_f16")
    ids = case_ids("mixed_layers_f16", model.lm_head.shape[0])
    full = model.forward(ids, model.new_cache())
    cache = model.new_cache()
    steps = [model.forward(ids[:7], cache)] + [model.forward([i], cache) for i in ids[7:]]
    assert np.abs(np.concatenate(steps) - full).max() < 1e-9


def test_reference_cli(checkpoint, tmp_path):
    d, model = checkpoint("gqa_bf16")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    out = tmp_path / "ref.bin"
    tool = REPO / "tools" / "reference.py"
    run([sys.executable, tool, "logits", "-m", d, "--ids", ",".join(map(str, ids)), "-o", out])
    got = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
    assert np.allclose(got, model.forward(ids, model.new_cache()), rtol=0, atol=1e-5)
    p = run([sys.executable, tool, "greedy", "-m", d, "--ids", "1,2,3", "-n", 8])
    assert json.loads(p.stdout) == model.greedy([1, 2, 3], 8)
