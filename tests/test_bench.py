"""`q3moe bench` on a tiny synthesized checkpoint.

Checks that the JSON report has every field with sane values (positive times,
ordered percentiles, consistent rates) and that the counted quantities (FLOPs
per prefill, weight bytes per decode token) equal values computed here
independently from config.json. No timing thresholds: the machine may be
loaded.
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
Q3MOE_ASAN = os.environ.get("Q3MOE_ASAN", str(REPO / "build" / "asan" / "q3moe"))
sys.path.insert(0, str(REPO / "tools"))
import reference  # noqa: E402

PROMPTS = [16, 32]
STEPS, REPS, DEPTH = 4, 2, 128  # DEPTH: the default
BF16, F32 = 2, 4


def run(cmd, ok=True, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    if ok:
        assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    d = tmp_path_factory.mktemp("bench") / "tiny"
    run([Q3MOE, "synth", "-o", d, "--preset", "tiny", "--layers", "2", "--vocab", "2048", "--tokenizer", "none"])
    return d


@pytest.fixture(scope="module")
def report(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out") / "bench.json"
    p = run([Q3MOE, "bench", "-m", model, "-p", ",".join(map(str, PROMPTS)), "-n", STEPS, "-r", REPS,
             "--json", out, "--membw-mb", "64"])
    return json.loads(out.read_text()), p.stdout, p.stderr, out


def geometry(model):
    c = json.loads((model / "config.json").read_text())
    L, H, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    D = c.get("head_dim") or H // c["num_attention_heads"]
    QD, KVD = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    E, K = c.get("num_experts", 0), c.get("num_experts_per_tok", 0)
    mlp_only, step = set(c.get("mlp_only_layers") or []), c.get("decoder_sparse_step", 1)
    sparse = [E > 0 and l not in mlp_only and (l + 1) % step == 0 for l in range(L)]
    return c, L, H, V, D, QD, KVD, E, K, sparse


def active_params(model):
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    p = 0
    for l in range(L):
        p += QD * H + 2 * KVD * H + H * QD
        p += E * H + K * 3 * c["moe_intermediate_size"] * H if sparse[l] else 3 * c["intermediate_size"] * H
    return p


def expected_matmul_flops(model, P):
    """The linear layers of a P-token prefill: every weight of the active
    parameters once per token, the lm_head for the last row."""
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    return 2 * active_params(model) * P + 2 * V * H


def expected_prefill_flops(model, P):
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    attn = 4 * D * c["num_attention_heads"] * P * (P + 1) / 2 * L
    return expected_matmul_flops(model, P) + attn


def expected_decode_bytes(model):
    """Weight bytes one decode token reads: every matrix is stored bf16; the
    norm vectors are read from their fp32 copies (widened at load)."""
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    b = 0
    for l in range(L):
        b += BF16 * (QD * H + 2 * KVD * H + H * QD)           # q, k, v, o
        b += F32 * (2 * H + 2 * D)                            # input/post-attn norms, q/k norms
        if sparse[l]:
            b += BF16 * E * H                                 # router
            b += BF16 * K * 3 * c["moe_intermediate_size"] * H  # k distinct experts
        else:
            b += BF16 * 3 * c["intermediate_size"] * H
    b += BF16 * V * H + F32 * H + BF16 * H                    # lm_head, final norm, one embedding row
    return b


def test_report_fields(report, model):
    r, stdout, stderr, _ = report
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    assert r["machine"]["cpu"] and r["machine"]["cores"] >= 1 and r["machine"]["threads"] >= 1
    assert r["fma_peak"]["gflops"] > 0 and r["fma_peak"]["method"]
    # the AMX tile peak, where the AMX kernels run: several times the FMA peak (16 x 16 x 32 per instruction)
    if r["machine"]["kernels"].startswith("amx"):
        assert r["fma_peak"]["amx_gflops"] > 2 * r["fma_peak"]["gflops"]
        assert f"AMX peak   {r['fma_peak']['amx_gflops']:.1f} GFLOP/s" in stdout
    else:
        assert "amx_gflops" not in r["fma_peak"] and "AMX peak" not in stdout
    bw = r["membw"]
    assert 0 < bw["median_gbs"] <= bw["best_gbs"]
    assert 60 << 20 < bw["buffer_bytes"] <= 64 << 20 and bw["passes"] >= 1
    # an FMA run before each prefill repetition and after the last, per prompt length
    fb = r["fma_peak"]["beside"]
    assert fb["runs"] == len(PROMPTS) * (int(REPS) + 1) and 0 < fb["worst_gflops"] <= fb["best_gflops"]
    assert r["fma_peak"]["ceiling_gflops"] == max(r["fma_peak"]["gflops"], fb["best_gflops"])
    assert f"beside prefill: FMA {fb['worst_gflops']:.1f} to {fb['best_gflops']:.1f} GFLOP/s over {fb['runs']} runs" in stdout
    # no reads beside decode: this checkpoint is smaller than the 64 MiB the bandwidth test reads
    assert (model / "model.safetensors").stat().st_size < 64 << 20
    assert bw["beside"] is None and bw["ceiling_gbs"] == bw["best_gbs"]
    assert "beside decode: no reads (the model's largest file is smaller than the 64 MiB buffer)" in stdout
    m = r["model"]
    assert m["layers"] == L and m["hidden_size"] == H and m["vocab_size"] == V and m["dtype"] == "BF16"
    assert m["active_params_per_token"] == active_params(model)
    assert r["ctx"] == max(PROMPTS + [DEPTH + STEPS])
    assert r["peak_rss_bytes"] > 0


def test_prefill(report, model):
    r = report[0]
    assert [p["tokens"] for p in r["prefill"]] == PROMPTS
    for p in r["prefill"]:
        assert p["reps"] == REPS
        assert 0 < p["ms_min"] <= p["ms_median"] <= p["ms_max"]
        assert p["tokens_per_s"] == pytest.approx(p["tokens"] * 1e3 / p["ms_median"], rel=1e-9)
        assert p["flops"] == pytest.approx(expected_prefill_flops(model, p["tokens"]), rel=1e-12)
        assert p["gflops"] == pytest.approx(p["flops"] / p["ms_median"] / 1e6, rel=1e-9)
        assert p["pct_fma_peak"] == pytest.approx(100 * p["gflops"] / r["fma_peak"]["ceiling_gflops"], rel=1e-9)
        # the engine counts the flops of the matmuls it runs: the model's linear layers
        assert p["matmul_flops"] == pytest.approx(expected_matmul_flops(model, p["tokens"]), rel=1e-12)
        assert 0 < p["matmul_time_share"] <= 1
        assert p["matmul_gflops"] >= p["matmul_flops"] / p["ms_max"] / 1e6 * p["matmul_time_share"] * 0.999
        assert p["matmul_pct_fma_peak"] == pytest.approx(100 * p["matmul_gflops"] / r["fma_peak"]["ceiling_gflops"], rel=1e-9)


def test_prefill_parts(report, model):
    """Prefill matmul time and flops per model part: each part's flops are
    its matrices' weights times the prompt's tokens (the lm_head: the last
    row only), and the parts' times add up to the matmul total."""
    r, stdout = report[0], report[1]
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    ns = sum(sparse)
    for p in r["prefill"]:
        P = p["tokens"]
        want = {"attention": 2 * P * L * (QD * H + 2 * KVD * H + H * QD), "router": 2 * P * ns * E * H,
                "experts": 2 * P * ns * K * 3 * c["moe_intermediate_size"] * H,
                "mlp": 2 * P * (L - ns) * 3 * c.get("intermediate_size", 0) * H, "lm_head": 2 * V * H}
        want = {k: v for k, v in want.items() if v}
        parts = p["matmul_parts"]
        assert sorted(parts) == sorted(want)
        for k, v in parts.items():
            assert v["ms"] > 0 and v["gflops"] * v["ms"] * 1e6 == pytest.approx(want[k], rel=1e-9), k
        total_ms = sum(v["ms"] for v in parts.values())
        assert total_ms == pytest.approx(p["matmul_flops"] / p["matmul_gflops"] / 1e6, rel=1e-9)
        assert f"{P} tokens, matmuls by part (ms, GFLOP/s, % peak): attention" in stdout
        # attention over the KV cache: the causal QK^T and PV flops of every layer, in its own time
        att_flops = 4 * D * c["num_attention_heads"] * P * (P + 1) / 2 * L
        assert p["attention_ms"] > 0
        assert p["attention_gflops"] * p["attention_ms"] * 1e6 == pytest.approx(att_flops, rel=1e-9)
        assert total_ms + p["attention_ms"] <= p["ms_max"] * (1 + 1e-9)
        assert f"{P} tokens, attention over the KV cache (QK^T, softmax, PV):" in stdout


def bench_ids(n, vocab, seed=0x5EED):
    """The prompt ids bench uses (bench_fill_ids: splitmix64 from seed, mod vocab)."""
    out, x, m = [], seed, (1 << 64) - 1
    for _ in range(n):
        x = (x + 0x9E3779B97F4A7C15) & m
        z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append((z ^ (z >> 31)) % vocab)
    return out


def reference_load(model, P):
    """Bench's expert load buckets for a P-token prefill, from the reference
    forward pass's own routing (softmax over all experts, top-k, ties to the
    lower index)."""
    m, counts = reference.Model(str(model)), {}
    moe = m.moe

    def counting_moe(l, h):
        probs = reference.softmax(h @ m.w[f"model.layers.{l}.mlp.gate.weight"].T)
        for t in range(len(h)):
            for e in np.argsort(-probs[t], kind="stable")[: m.top_k]:
                counts[(l, int(e))] = counts.get((l, int(e)), 0) + 1
        return moe(l, h)

    m.moe = counting_moe
    m.forward(bench_ids(P, json.loads((model / "config.json").read_text())["vocab_size"]), m.new_cache())
    tops = [(0, "0"), (8, "1-8"), (16, "9-16"), (32, "17-32"), (64, "33-64"), (128, "65-128")]
    load = {label: 0 for _, label in tops} | {"129+": 0}
    for l in range(m.n_layers):
        if not m.sparse[l]:
            continue
        for e in range(m.n_experts):
            n = counts.get((l, e), 0)
            load[next((label for top, label in tops if n <= top), "129+")] += 1
    return load


def test_prefill_expert_load(report, model):
    """How many (layer, expert) pairs got how many of the prompt's tokens:
    the routing of the reference forward pass on the same ids."""
    r, stdout = report[0], report[1]
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    for p in r["prefill"]:
        load, P = p["expert_load"], p["tokens"]
        assert sum(load.values()) == sum(sparse) * E
        assert load == reference_load(model, P), P
        line = ", ".join(f"{k}: {v}" for k, v in load.items())
        assert f"{P} tokens, experts by tokens routed to them (sparse layers x experts, first rep): {line}" in stdout


def test_decode(report, model):
    r = report[0]
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    d = r["decode"]
    assert (d["depth"], d["steps"], d["reps"]) == (DEPTH, STEPS, REPS)
    assert 0 < d["ms_p50"] <= d["ms_p90"] <= d["ms_p99"]
    assert d["tokens_per_s"] == pytest.approx(1e3 / d["ms_p50"], rel=1e-9)
    assert d["expert_reads_per_token"] == K * sum(sparse)
    assert d["weight_bytes_per_token"] == expected_decode_bytes(model)
    assert d["fixed_bytes_per_token"] + d["expert_bytes_per_token"] == d["weight_bytes_per_token"]
    assert d["gbs"] == pytest.approx(d["weight_bytes_per_token"] / d["ms_p50"] / 1e6, rel=1e-9)
    assert 0 < d["matmul_ms_per_token"] <= d["ms_p99"] and 0 < d["matmul_time_share"] <= 1
    # the mean step (llama-bench's statistic): at least half the steps take p50 or longer, and the
    # matmuls' share is of the steps' summed time
    assert d["ms_mean"] >= d["ms_p50"] / 2
    assert d["matmul_time_share"] == pytest.approx(d["matmul_ms_per_token"] / d["ms_mean"], rel=1e-9)
    assert d["pct_membw"] == pytest.approx(100 * d["gbs"] / r["membw"]["ceiling_gbs"], rel=1e-9)
    # mean K/V cache read over positions DEPTH .. DEPTH+STEPS-1 (fp32 cache)
    kv = sum(2 * L * (DEPTH + i + 1) * KVD * F32 for i in range(STEPS)) / STEPS
    assert d["kv_bytes_per_token"] == pytest.approx(kv, rel=1e-12)
    # attention over that cache: its own time, apart from the matmuls'
    assert d["attention_ms_per_token"] > 0 and 0 < d["attention_time_share"] < 1
    assert d["attention_time_share"] + d["matmul_time_share"] <= 1 + 1e-9
    assert "attention over the KV cache: " in report[1]


def test_decode_parts(report, model):
    """Matmul time and weight bytes per model part: the bytes each part's
    matrices hold (bf16 here), the times adding up to the matmul total."""
    d = report[0]["decode"]
    c, L, H, V, D, QD, KVD, E, K, sparse = geometry(model)
    ns = sum(sparse)
    want = {"attention": BF16 * L * (QD * H + 2 * KVD * H + H * QD), "router": BF16 * ns * E * H,
            "experts": BF16 * ns * K * 3 * c["moe_intermediate_size"] * H,
            "mlp": BF16 * (L - ns) * 3 * c.get("intermediate_size", 0) * H, "lm_head": BF16 * V * H}
    want = {k: v for k, v in want.items() if v}
    parts = d["matmul_parts"]
    assert sorted(parts) == sorted(want)
    for k, v in parts.items():
        assert v["weight_bytes_per_token"] == pytest.approx(want[k], rel=1e-12), k
        assert v["ms_per_token"] > 0 and v["gbs"] == pytest.approx(v["weight_bytes_per_token"] / v["ms_per_token"] / 1e6, rel=1e-9)
    assert parts["experts"]["weight_bytes_per_token"] == pytest.approx(d["expert_bytes_per_token"], rel=1e-12)
    assert sum(v["ms_per_token"] for v in parts.values()) == pytest.approx(d["matmul_ms_per_token"], rel=1e-9)
    assert "by part (ms/token, MB/token, GB/s): attention" in report[1]


def test_ttft(report):
    r = report[0]
    t = r["ttft"]
    assert t["prompt_tokens"] == PROMPTS[0]
    assert 0 < t["cold_ms"] <= t["cold_exit_ms"] and 0 < t["warm_ms"] <= t["warm_exit_ms"]
    assert t["cold_peak_rss_bytes"] > 0 and t["warm_peak_rss_bytes"] > 0
    assert t["evicted_files"] >= 2 and t["evicted_bytes"] > 0  # config.json + model.safetensors
    assert 0 <= t["resident_fraction_after_evict"] <= 1
    assert "fadvise" in t["cold_method"]


def test_table_and_progress(report):
    _, stdout, stderr, _ = report
    for word in ["prefill", "decode", "p50 ms", "mean ms", "GB/s", "% membw", "FMA peak", "mem read", "time to first token",
                 "posix_fadvise", "peak RSS", "after a 128-token prefill"]:
        assert word in stdout, word
    assert "[bench]" in stderr and "[bench]" not in stdout


def test_refuses_overwrite(report, model):
    _, _, _, out = report
    before = out.read_text()
    p = run([Q3MOE, "bench", "-m", model, "-p", "8", "-n", "1", "-r", "1", "--json", out, "--no-membw",
             "--no-ttft"], ok=False)
    assert p.returncode != 0
    assert "q3moe bench: error:" in p.stderr and "already exists" in p.stderr
    assert out.read_text() == before
    p = run([Q3MOE, "bench", "-m", model, "-p", "8", "-n", "1", "-r", "1", "--json", out, "--no-membw",
             "--no-ttft", "--force"])
    r = json.loads(out.read_text())
    assert r["membw"] is None and r["ttft"] is None and r["decode"]["pct_membw"] is None
    assert [p["tokens"] for p in r["prefill"]] == [8]


def test_hugepages(report, model, tmp_path):
    """--hugepages is reported in the table and the JSON (with the bytes the kernel put in huge
    pages, which may be 0 where transparent huge pages are off); the default run maps the file."""
    r0, stdout0, _, _ = report
    assert r0["hugepages"] is False and "--hugepages" not in stdout0
    # the mapped run says how much of the mapping has 2 MiB entries (0 for this small checkpoint
    # or without large folios in the page cache), at most the process's file mappings
    assert 0 <= r0["file_pmd_mapped_bytes"] <= r0["peak_rss_bytes"]
    assert f"weights    mapped: {r0['file_pmd_mapped_bytes'] / 1e9:.2f} GB of {r0['model']['bytes'] / 1e9:.2f} GB" in stdout0
    out = tmp_path / "h.json"
    p = run([Q3MOE, "bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "--json", out, "--no-membw", "--no-ttft",
             "--hugepages"])
    r = json.loads(out.read_text())
    assert r["hugepages"] is True and r["huge_page_bytes"] >= 0
    assert "--hugepages: copied into anonymous memory" in p.stdout


def test_read_beside_decode(model, tmp_path):
    """With a bandwidth buffer no larger than the model's file, bench reads that many bytes of the
    mapped weights before each decode repetition and after the last (4 passes each), and % membw is
    of the best read of the run: at the end or beside."""
    out = tmp_path / "b.json"
    p = run([Q3MOE, "bench", "-m", model, "-p", "0", "-n", "2", "-r", "2", "--membw-mb", "1", "--no-ttft",
             "--json", out])
    r = json.loads(out.read_text())
    bw = r["membw"]
    b = bw["beside"]
    assert b["passes"] == 4 * (2 + 1) and b["bytes"] == 1 << 20 and 0 < b["worst_gbs"] <= b["best_gbs"]
    assert bw["ceiling_gbs"] == max(bw["best_gbs"], b["best_gbs"])
    d = r["decode"]
    assert d["pct_membw"] == pytest.approx(100 * d["gbs"] / bw["ceiling_gbs"], rel=1e-9)
    assert f"beside decode: read {b['worst_gbs']:.2f} to {b['best_gbs']:.2f} GB/s over 12 passes" in p.stdout
    assert r["fma_peak"]["beside"] is None  # no prefill, no FMA runs beside it
    assert r["fma_peak"]["ceiling_gflops"] == r["fma_peak"]["gflops"]
    assert "% peak and % membw below are of the best the run saw" in p.stdout


def test_membw_only(tmp_path):
    out = tmp_path / "m.json"
    run([Q3MOE, "bench", "--membw", "--membw-mb", "16", "-t", "1", "--json", out])
    r = json.loads(out.read_text())
    assert r["machine"]["threads"] == 1 and r["membw"]["best_gbs"] > 0 and r["fma_peak"]["gflops"] > 0
    assert r["membw"]["method"] in ("scalar sum", "avx2 sum", "avx2 sum, prefetch into L2", "avx2 sum, prefetch into L1")
    assert "model" not in r and "prefill" not in r


def test_kernels_reported(report, tmp_path):
    """The table and the JSON name the kernels in use; Q3MOE_ISA=scalar forces the scalar ones."""
    r, stdout, _, _ = report
    kernels = r["machine"]["kernels"]
    assert kernels.split("+")[0] in ("scalar", "avx2", "avx512", "avx512bf16", "amx")
    assert f"; kernels {kernels}" in stdout
    out = tmp_path / "s.json"
    p = run([Q3MOE, "bench", "--membw", "--membw-mb", "8", "-t", "1", "--json", out],
            env={**os.environ, "Q3MOE_ISA": "scalar"})
    assert json.loads(out.read_text())["machine"]["kernels"] == "scalar"
    assert "; kernels scalar" in p.stdout


@pytest.mark.parametrize("args, needle", [
    (["-p", "100", "--ctx", "64"], "-p"),
    (["-p", "16", "--ctx", "64", "--depth", "60", "-n", "8"], "--depth"),
    (["-p", "16,x"], "-p"),
    (["-p", "0,16"], "-p"),
    (["-r", "0"], "-r"),
    (["-n", "-1"], "-n"),
    (["--ctx", "100000000"], "--ctx"),
    (["--bogus"], "--bogus"),
    (["--membw", "--no-membw"], "--membw"),
])
def test_bad_input(model, args, needle):
    p = run([Q3MOE, "bench", "-m", model] + args, ok=False)
    assert p.returncode != 0
    assert "q3moe bench: error:" in p.stderr and needle in p.stderr
    assert p.stdout == ""


def test_bad_model_dir(tmp_path):
    p = run([Q3MOE, "bench", "-m", tmp_path / "nope"], ok=False)
    assert p.returncode != 0 and "q3moe bench: error:" in p.stderr
    p = run([Q3MOE, "bench"], ok=False)
    assert p.returncode != 0 and "-m" in p.stderr


def test_help():
    p = run([Q3MOE, "bench", "--help"])
    assert "usage: q3moe bench" in p.stdout and "--membw-mb" in p.stdout


def test_asan_smoke(model, tmp_path):
    """The whole bench once under ASan + UBSan (leaks included)."""
    if not os.access(Q3MOE_ASAN, os.X_OK):
        pytest.skip(f"no ASan build at {Q3MOE_ASAN}")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    out = tmp_path / "a.json"
    p = run([Q3MOE_ASAN, "bench", "-m", model, "-p", "8", "-n", "2", "-r", "1", "--depth", "4", "--membw-mb", "8",
             "--json", out], env=env)
    assert "runtime error" not in p.stderr
    assert json.loads(out.read_text())["decode"]["weight_bytes_per_token"] == expected_decode_bytes(model)


@pytest.mark.parametrize("var,off,on,suffix", [("Q3MOE_GEMV_PREFETCH", "sw", "hw", "+hwpf"),
                                               ("Q3MOE_PREFETCH_TO", "l1", "l2", "+pfl2")])
def test_gemv_prefetch_choice(model, tmp_path, var, off, on, suffix):
    """Q3MOE_GEMV_PREFETCH=sw|hw picks the SIMD plain GEMV (the kernels name
    ends in +hwpf for hw), Q3MOE_PREFETCH_TO=l1|l2 the cache the GEMVs
    prefetch into (+pfl2 for l2); anything else is named on stderr and
    ignored, and decode logits are the same bits either way."""
    def kernels(value):
        out = tmp_path / f"m_{value}.json"
        p = run([Q3MOE, "bench", "--membw", "--membw-mb", "8", "-t", "1", "--json", out], env={**os.environ, var: value})
        return json.loads(out.read_text())["machine"]["kernels"], p.stderr

    without, _ = kernels(off)
    with_, _ = kernels(on)
    assert suffix not in without
    assert with_ == without if without == "scalar" else (suffix in with_ and with_.replace(suffix, "") == without)
    _, err = kernels("sometimes")
    assert f"{var}=sometimes" in err and f"{off} or {on}" in err

    ids = ",".join(str(i) for i in range(3, 40, 3))
    logits = {}
    for value in (off, on):
        out = tmp_path / f"logits_{value}.bin"
        run([Q3MOE, "logits", "-m", model, "--ids", ids, "--prefill", "2", "-o", out], env={**os.environ, var: value})
        logits[value] = out.read_bytes()
    assert len(logits[off]) > 0 and logits[off] == logits[on]
