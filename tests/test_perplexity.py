"""`q3moe perplexity`: the numbers it prints are recomputed here in numpy from
`q3moe logits` of the same token chunks (perplexity = exp(mean NLL of each
chunk's next tokens); KL(base || model), top-1 agreement and max |delta
logit| over the same positions), a model against itself gives exactly zero
divergence, a W4A8 copy (`q3moe convert`) a positive one, and bad input a
clear error.

Checkpoints: the tiny preset cut to one layer, with the real Qwen3 tokenizer
(so vocab 151936); the text is a few lines of tests/data/tokenizer_corpus.jsonl.
Every run uses one thread.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))
TOKENIZER_DIR = REPO / "build" / "tokenizer"
CORPUS = REPO / "tests" / "data" / "tokenizer_corpus.jsonl"
T1 = ["-t", "1"]
TIMEOUT_S = 300


def run(args, env=None):
    env = dict(os.environ, **(env or {}))
    return subprocess.run([Q3MOE] + [str(a) for a in args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


def ok(args, env=None):
    p = run(args, env)
    assert p.returncode == 0, f"q3moe {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}"
    return p


def fails(args, code, *words):
    """The command exits with `code` and its stderr names every word."""
    p = run(args)
    assert p.returncode == code, f"expected exit {code}, got {p.returncode}:\n{p.stderr}"
    for w in words:
        assert w.lower() in p.stderr.lower(), f"{w!r} not in the error message:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    return tmp_path_factory.mktemp("ppl")


def synth(d, seed, tokenizer=TOKENIZER_DIR, *extra):
    ok(["synth", "-o", d, "--preset", "tiny", "--layers", "1", "--seed", seed, "--tokenizer", tokenizer] + list(extra))
    return d


@pytest.fixture(scope="module")
def model(root):
    return synth(root / "a", 11)


@pytest.fixture(scope="module")
def other(root):
    """Same geometry and tokenizer, different weights."""
    return synth(root / "b", 12)


@pytest.fixture(scope="module")
def text(root):
    with open(CORPUS, encoding="utf-8") as f:
        lines = [json.loads(next(f)) for _ in range(6)]
    p = root / "text.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def ids(model, text):
    return json.loads(ok(["tokenize", "-m", model, "-f", text]).stdout)


def perplexity(tmp_path, *args, name="ppl.json", env=None):
    out = tmp_path / name
    p = ok(["perplexity", "-f"] + list(args) + T1 + ["--json", out], env)
    with open(out) as f:
        lines = f.read().splitlines()
    assert len(lines) == 1, "--json writes one line"
    return json.loads(lines[0]), p


def chunk_logits(d, ids, chunk, tmp_path):
    """q3moe logits of each chunk of ids, run from an empty cache (float64)."""
    out = []
    for c in range(0, len(ids), chunk):
        f = tmp_path / f"logits_{os.path.basename(d)}_{c}.bin"
        part = ids[c : c + chunk]
        ok(["logits", "-m", d, "--ids", ",".join(map(str, part)), "-o", f, "--force"] + T1)
        out.append(np.fromfile(f, dtype="<f4").reshape(len(part), -1).astype(np.float64))
        f.unlink()
    return out


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def expected(ids, chunk, logits, base_logits=None):
    """What perplexity should report, from per-chunk logits."""
    nll, kl, agree, max_d, n = [], [], 0, 0.0, 0
    for c, lg in zip(range(0, len(ids), chunk), logits):
        nxt = np.asarray(ids[c + 1 : c + chunk])
        rows = lg[: len(nxt)]
        lp = log_softmax(rows)
        nll += list(-lp[np.arange(len(nxt)), nxt])
        n += len(nxt)
    r = {"scored": n, "mean_nll": float(np.mean(nll))}
    if base_logits is not None:
        for c, lg, bl in zip(range(0, len(ids), chunk), logits, base_logits):
            k = len(ids[c + 1 : c + chunk])
            lp, lb = log_softmax(lg[:k]), log_softmax(bl[:k])
            kl += list((np.exp(lb) * (lb - lp)).sum(axis=1))
            agree += int((lg[:k].argmax(1) == bl[:k].argmax(1)).sum())
            if k:
                max_d = max(max_d, float(np.abs(lg[:k] - bl[:k]).max()))
        r.update(kl_mean=float(np.mean(kl)), top1_agree=agree, max_abs_dlogit=max_d)
    return r


@pytest.mark.parametrize("chunk", [None, 16])
def test_perplexity_is_exp_mean_nll(model, text, ids, chunk, tmp_path):
    assert len(ids) > 40, "the test text should span several chunks of 16"
    args = [text, "-m", model] + (["--chunk", chunk] if chunk else [])
    got, p = perplexity(tmp_path, *args)
    eff = chunk or len(ids)
    want = expected(ids, eff, chunk_logits(model, ids, eff, tmp_path))
    print(f"chunk {chunk}: perplexity {got['perplexity']:.6g}, {got['scored']} scored of {got['tokens']} tokens")
    assert got["tokens"] == len(ids)
    assert got["scored"] == want["scored"] == len(ids) - -(-len(ids) // eff)
    assert got["chunks"] == sum(1 for c in range(0, len(ids), eff) if len(ids) - c >= 2)
    assert got["mean_nll"] == pytest.approx(want["mean_nll"], rel=1e-9)
    assert got["perplexity"] == pytest.approx(np.exp(want["mean_nll"]), rel=1e-8)
    assert got["base"] is None and "kl_mean" not in got
    assert f"{got['perplexity']:.6f}" in p.stdout and f"{got['scored']} scored" in p.stdout
    assert p.stderr.count("[q3moe] chunk") == -(-len(ids) // eff), "one progress line per chunk"


def test_ids_instead_of_text(model, root, text, ids, tmp_path):
    from_text, _ = perplexity(tmp_path, text, "-m", model, "--chunk", 32, name="text.json")
    out = tmp_path / "ids.json"
    ok(["perplexity", "-m", model, "--ids", ",".join(map(str, ids)), "--chunk", 32, "--json", out] + T1)
    from_ids = json.loads(out.read_text())
    assert from_ids["mean_nll"] == from_text["mean_nll"] and from_ids["text"] is None
    # --ids needs no tokenizer
    small = synth(root / "small_ids", 14, "none", "--vocab", "512")
    ok(["perplexity", "-m", small, "--ids", "1,2,3,4,5"] + T1)


def test_model_against_itself(model, text, ids, tmp_path):
    got, p = perplexity(tmp_path, text, "-m", model, "--base", model)
    assert got["kl_mean"] == 0.0
    assert got["top1_agree"] == got["scored"] == len(ids) - 1 and got["top1_pct"] == 100.0
    assert got["max_abs_dlogit"] == 0.0
    assert got["perplexity"] == got["base_perplexity"]
    assert "top-1 agreement: 100.00%" in p.stdout


def test_divergence_matches_numpy(model, other, text, ids, tmp_path):
    """Two different models: every --base number recomputed from q3moe logits."""
    chunk = 24
    got, _ = perplexity(tmp_path, text, "-m", model, "--base", other, "--chunk", chunk)
    want = expected(ids, chunk, chunk_logits(model, ids, chunk, tmp_path), chunk_logits(other, ids, chunk, tmp_path))
    print(f"KL {got['kl_mean']:.6g}, top-1 {got['top1_pct']:.2f}%, max|dlogit| {got['max_abs_dlogit']:.4g}")
    assert got["kl_mean"] > 0 and got["kl_mean"] == pytest.approx(want["kl_mean"], rel=1e-9)
    assert got["top1_agree"] == want["top1_agree"]
    assert got["top1_pct"] == pytest.approx(100.0 * want["top1_agree"] / want["scored"])
    assert got["max_abs_dlogit"] == pytest.approx(want["max_abs_dlogit"], rel=1e-12)
    base_alone, _ = perplexity(tmp_path, text, "-m", other, "--chunk", chunk, name="base.json")
    assert got["base_mean_nll"] == base_alone["mean_nll"]


def test_w4a8_copy_diverges(model, text, tmp_path):
    q3m = tmp_path / "w4a8.q3m"
    ok(["convert", "-m", model, "-o", q3m, "--ffn", "mxfp4", "--attn", "mxfp8", "--act", "mxfp8"])
    got, _ = perplexity(tmp_path, text, "-m", q3m, "--base", model)
    print(f"W4A8: perplexity {got['perplexity']:.6g} vs {got['base_perplexity']:.6g}, KL {got['kl_mean']:.6g}, "
          f"top-1 {got['top1_pct']:.2f}%, max|dlogit| {got['max_abs_dlogit']:.4g}")
    assert got["kl_mean"] > 0 and got["max_abs_dlogit"] > 0
    assert 0 <= got["top1_pct"] <= 100
    assert np.isfinite(got["perplexity"]) and got["perplexity"] != got["base_perplexity"]
    # --quant w4a8 runs the same scheme through the conversion cache: the same numbers
    cached, _ = perplexity(tmp_path, text, "-m", model, "--quant", "w4a8", "--base", model, name="cached.json",
                           env={"Q3MOE_CACHE_DIR": str(tmp_path / "cache")})
    assert cached["quant"] == "w4a8" and got["quant"] is None
    for k in ("mean_nll", "kl_mean", "top1_agree", "max_abs_dlogit"):
        assert cached[k] == got[k], k


# ------------------------------------------------------------------ errors


def test_errors(model, text, root, tmp_path):
    ppl = ["perplexity", "-m", model] + T1
    fails(ppl + ["-f", tmp_path / "missing.txt"], 1, "missing.txt")
    fails(["perplexity", "-m", tmp_path / "nothing-here", "-f", text] + T1, 1, "nothing-here")
    fails(ppl, 2, "-f")
    fails(["perplexity", "-f", text], 2, "-m")
    fails(ppl + ["-f", text, "--chunk", "1"], 2, "--chunk")
    fails(ppl + ["-f", text, "--chunk", "64", "--ctx", "32"], 1, "--chunk")
    fails(ppl + ["-f", text, "--ctx", "1"], 2, "--ctx")  # one position scores nothing (it printed nan)
    fails(ppl + ["-f", text, "--bogus"], 2, "--bogus")
    for content, n in (("", 0), ("a", 1)):
        short = tmp_path / f"short{n}.txt"
        short.write_text(content)
        fails(ppl + ["-f", short], 1, f"{n} token", "at least 2")
    # vocabularies that differ (and no tokenizer on the base side)
    small = synth(root / "small", 13, "none", "--vocab", "512")
    fails(ppl + ["-f", text, "--base", small], 1, "vocab", "512", "151936")
    # nothing to tokenize with
    fails(["perplexity", "-m", small, "-f", text] + T1, 1, "tokenizer", "--ids")
    fails(ppl + ["--ids", "5"], 1, "1 token", "at least 2")
    fails(ppl + ["--ids", "1,2", "-f", text], 2, "--ids")
    fails(ppl + ["--ids", "1,151936"], 1, "151936")
    # a model whose context is a single position: nothing to score (it printed nan and exited 0)
    one = synth(root / "one", 14, "none")
    cfg = json.loads((one / "config.json").read_text())
    cfg["max_position_embeddings"] = 1
    (one / "config.json").write_text(json.dumps(cfg))
    fails(["perplexity", "-m", one, "--ids", "5,6"] + T1, 1, "context holds 1 token", "at least 2")
    # --json refuses to overwrite without --force
    out = tmp_path / "exists.json"
    out.write_text("keep\n")
    fails(ppl + ["-f", text, "--json", out], 1, "exists.json", "--force")
    assert out.read_text() == "keep\n"
    ok(ppl + ["-f", text, "--json", out, "--force", "--chunk", "8"])
    assert json.loads(out.read_text())["chunk"] == 8
