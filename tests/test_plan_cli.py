"""`q3moe plan`: the parallel plan and its performance prediction.

Runs the ASan+UBSan binary ($Q3MOE_ASAN) on checkpoint directories that hold
only config.json (`q3moe synth --dry-run`): a plan never reads weights, so
every answer, good or bad, must come from config.json and the plan alone.
Bad YAML, bad flags and plans that break a rule must fail with a message
naming the key (and the line, for YAML) and no sanitizer report. The JSON
prediction's communication bytes must equal the comm layer's link-byte
formulas (src/parallel/comm.h), computed here independently.
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q3MOE = os.environ.get("Q3MOE") or os.path.join(ROOT, "build", "q3moe")
Q3MOE_ASAN = os.environ.get("Q3MOE_ASAN") or os.path.join(ROOT, "build", "asan", "q3moe")
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
TIMEOUT_S = 120


def run(args, binary=None):
    env = dict(os.environ)
    env.update(SAN_ENV)
    p = subprocess.run([binary or Q3MOE_ASAN] + [str(a) for a in args], capture_output=True, text=True,
                       errors="replace", timeout=TIMEOUT_S, env=env)
    assert "Sanitizer" not in p.stderr and "runtime error:" not in p.stderr, "sanitizer report\n" + p.stderr
    return p


def shown(p):
    return f"command: {' '.join(map(str, p.args))}\nexit: {p.returncode}\nstderr:\n{p.stderr}\nstdout:\n{p.stdout[-3000:]}"


def ok(args):
    p = run(args)
    assert p.returncode == 0, shown(p)
    return p


def fails(args, *must, code=None):
    p = run(args)
    assert p.returncode != 0 and p.returncode not in (134, 139) and p.returncode > 0, shown(p)
    if code is not None:
        assert p.returncode == code, shown(p)
    assert "error" in p.stderr, shown(p)
    for m in must:
        assert m in p.stderr, f"expected {m!r} in the message\n" + shown(p)
    return p


def config_only(out_dir, preset, *extra):
    p = subprocess.run([Q3MOE, "synth", "--dry-run", "-o", str(out_dir), "--preset", preset, *extra],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr
    assert os.listdir(out_dir) == ["config.json"], os.listdir(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny preset: 8 query / 4 KV heads, 16 experts top-4, vocab 151936."""
    return config_only(tmp_path_factory.mktemp("plan") / "tiny", "tiny")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Qwen3-235B-A22B geometry: 94 layers, 64 / 4 heads, 128 experts top-8."""
    return config_only(tmp_path_factory.mktemp("plan") / "q235", "qwen3-235b-a22b")


@pytest.fixture
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("w")


def yaml_file(work, text, name="run.yaml"):
    path = work / name
    path.write_text(text)
    return path


def link(kind, p, b, root=False):
    """comm.h: link bytes per call for this rank (max of sent and received)."""
    if p <= 1:
        return 0
    return {"allreduce_sum": 2 * (p - 1) * b // p, "allgather": (p - 1) * b, "reduce_scatter_sum": (p - 1) * b,
            "alltoall": (p - 1) * b, "broadcast": b}[kind]


def plan_json(args, work):
    out = work / "plan.json"
    ok(args + ["--json", out, "--force"])
    return json.loads(out.read_text())


# ------------------------------------------------------------------ good

def test_plan_reads_a_q3m(work):
    """A .q3m gives its config and, unless --quant says otherwise, its scheme."""
    ck = work / "ck"
    subprocess.run([Q3MOE, "synth", "-o", ck, "--preset", "tiny", "--layers", "2", "--vocab", "512", "--tokenizer",
                    "none"], check=True, capture_output=True, timeout=TIMEOUT_S)
    q = work / "m.q3m"
    subprocess.run([Q3MOE, "convert", "-m", ck, "-o", q, "--quant", "w4a8", "-q"], check=True, capture_output=True,
                   timeout=TIMEOUT_S)
    from_file = plan_json(["plan", "-m", q, "--ranks", "2"], work)
    from_dir = plan_json(["plan", "-m", ck, "--ranks", "2", "--quant", "w4a8"], work)
    assert from_file["quant"] == "w4a8" and from_file == from_dir
    assert plan_json(["plan", "-m", q, "--ranks", "2", "--quant", "bf16"], work)["quant"] == "bf16"
    # a scheme of its own: planned with the file's dtypes (attention as stored: between w4a8 and bf16)
    mixed = work / "mixed.q3m"
    subprocess.run([Q3MOE, "convert", "-m", ck, "-o", mixed, "--quant", "w4a8", "--attn", "bf16", "-q"], check=True,
                   capture_output=True, timeout=TIMEOUT_S)
    own = plan_json(["plan", "-m", mixed, "--ranks", "2"], work)
    bf16 = plan_json(["plan", "-m", ck, "--ranks", "2"], work)
    assert "attn as stored" in own["quant"], own["quant"]
    w = lambda j: j["weights_bytes_per_rank"]
    assert w(from_file) < w(own) < w(bf16), (w(from_file), w(own), w(bf16))
    packed = plan_json(["plan", "-m", ck, "--ranks", "2", "--quant", "bf16p"], work)
    assert w(packed) < w(bf16)
    # a bf16p file (its lm_head packed too, which only its tensor shows) plans as bf16p
    p_file = work / "p.q3m"
    subprocess.run([Q3MOE, "convert", "-m", ck, "-o", p_file, "--quant", "bf16p", "-q"], check=True, capture_output=True,
                   timeout=TIMEOUT_S)
    assert plan_json(["plan", "-m", p_file, "--ranks", "2"], work) == packed
    # MX attention alone brings the MX slicing rules (the engine's check)
    hd = work / "hd16"
    subprocess.run([Q3MOE, "synth", "-o", hd, "--preset", "tiny", "--layers", "1", "--head-dim", "16", "--vocab", "512",
                    "--tokenizer", "none"], check=True, capture_output=True, timeout=TIMEOUT_S)
    a8 = work / "hd16.q3m"
    subprocess.run([Q3MOE, "convert", "-m", hd, "-o", a8, "--quant", "bf16", "--attn", "mxfp8", "-q"], check=True,
                   capture_output=True, timeout=TIMEOUT_S)
    fails(["plan", "-m", a8, "--ranks", "8"], "attn_tp_size", "multiple of 32")

def test_plan_prints_the_assignment(tiny):
    p = ok(["plan", "-m", tiny, "--ranks", "8"])
    out = p.stdout
    assert "parallel plan: 8 ranks" in out
    # 8 attention ranks over 4 KV heads: each KV head on 2 ranks
    assert "each KV head replicated on 2 ranks" in out, out
    assert "attn_tp  1 group of 8: {0,1,2,3,4,5,6,7}" in out, out
    assert "moe_ep   1 group of 8" in out and "2 of 16 experts per rank" in out, out
    row7 = next(l for l in out.splitlines() if l.strip().startswith("7 "))
    assert "[7,8)" in row7 and "[3,4) x2" in row7 and "[14,16)" in row7 and "[132944,151936)" in row7, row7
    assert "prediction per rank" in out and "ms/token" in out


def test_yaml_plan_and_flag_override(tiny, work):
    y = yaml_file(work, f"model_path: {tiny}\nparallel_config:\n  attn_tp_size: 2\n  moe_ep_size: 2\n"
                        "  moe_tp_size: 2\n  lmhead_tp_size: 4\n  comm_quant: mxfp8\n")
    j = plan_json(["plan", "--config", y, "--ranks", "4"], work)   # -m from model_path
    assert j["plan"] == {"attn_tp_size": 2, "moe_tp_size": 2, "moe_ep_size": 2, "lmhead_tp_size": 4,
                         "moe_ep_comm": "allgather", "moe_ep_comm_reason": j["plan"]["moe_ep_comm_reason"],
                         "comm_quant": "mxfp8", "sp_prefill": True}
    j = plan_json(["plan", "--config", y, "--ranks", "4", "--attn-tp", "4", "--moe-ep", "4", "--moe-tp", "1"], work)
    assert (j["plan"]["attn_tp_size"], j["plan"]["moe_ep_size"], j["plan"]["moe_tp_size"]) == (4, 4, 1)
    assert j["plan"]["lmhead_tp_size"] == 4 and j["plan"]["comm_quant"] == "mxfp8"


def test_auto_ep_comm_choice(tiny, work):
    # top_k 4: allgather while top_k >= ep, alltoall beyond
    j = plan_json(["plan", "-m", tiny, "--ranks", "2"], work)
    assert j["plan"]["moe_ep_comm"] == "allgather" and "top_k 4 > moe_ep_size 2" in j["plan"]["moe_ep_comm_reason"]
    j = plan_json(["plan", "-m", tiny, "--ranks", "8"], work)
    assert j["plan"]["moe_ep_comm"] == "alltoall" and "top_k 4 < moe_ep_size 8" in j["plan"]["moe_ep_comm_reason"]
    alt = j["prefill_ep_alternatives"]
    assert alt["alltoall_bytes_per_layer"] < alt["allgather_bytes_per_layer"], alt
    j = plan_json(["plan", "-m", tiny, "--ranks", "8", "--moe-ep-comm", "allgather"], work)
    assert j["plan"]["moe_ep_comm"] == "allgather" and "set by moe_ep_comm" in j["plan"]["moe_ep_comm_reason"]
    # without SP prefill the tokens are replicated: auto keeps allgather (as the engine runs it)
    j = plan_json(["plan", "-m", tiny, "--ranks", "8", "--attn-tp", "1"], work)
    assert j["plan"]["sp_prefill"] is False and j["plan"]["moe_ep_comm"] == "allgather", j["plan"]
    assert "replicated tokens" in j["plan"]["moe_ep_comm_reason"]
    assert not any(r["collective"] == "alltoallv" for r in j["decode"]["comm"] + j["prefill"]["comm"])


def test_no_sp_note(tiny):
    p = ok(["plan", "-m", tiny, "--ranks", "4", "--attn-tp", "4", "--moe-ep", "2", "--moe-tp", "2"])
    assert "no sequence-parallel prefill: it needs attn_tp_size == moe_ep_size (here 4 and 2)" in p.stdout, p.stdout


@pytest.mark.parametrize("ranks,quant,extra", [(8, "bf16", []), (4, "w4a8", ["--comm-quant", "mxfp8"])])
def test_qwen3_235b_prediction_uses_the_comm_formulas(big, work, ranks, quant, extra):
    S = 512
    j = plan_json(["plan", "-m", big, "--ranks", ranks, "--quant", quant, "--prompt", S] + extra, work)
    H, V, L = 4096, 151936, 94
    assert j["plan"]["sp_prefill"] is True and j["plan"]["moe_ep_comm"] == "allgather"   # top_k 8 >= ep
    dec = {r["where"]: r for r in j["decode"]["comm"]}
    assert set(dec) == {"attention", "MoE", "lm_head"}
    for where, kind, size, b in [("attention", "allreduce_sum", ranks, H * 4), ("MoE", "allreduce_sum", ranks, H * 4),
                                 ("lm_head", "allgather", ranks, 20 * 8)]:   # top-k 20 (id, logit) candidates
        r = dec[where]
        assert (r["collective"], r["group_size"]) == (kind, size), r
        assert max(r["bytes_sent_per_call"], r["bytes_recv_per_call"]) == link(kind, size, b), r
    assert dec["attention"]["calls"] == L and dec["lm_head"]["calls"] == 1
    pre = {r["where"]: r for r in j["prefill"]["comm"]}
    s = -(-S // ranks)
    row_in = s * (H + H // 32 if extra else H * 4)
    assert pre["attention in"]["bytes_sent_per_call"] == link("allgather", ranks, row_in)
    qd = 64 // ranks * 128   # each rank's heads x head_dim: the attention output alltoall's row
    row_att = s * (qd + qd // 32 if extra else qd * 4)
    assert pre["attention out"]["collective"] == "alltoall"
    assert pre["attention out"]["bytes_sent_per_call"] == link("alltoall", ranks, row_att)
    # the MoE rows carry their top-8 ids and weights in fp32
    assert pre["MoE in"]["bytes_sent_per_call"] == link("allgather", ranks, row_in + s * 2 * 8 * 4)
    assert pre["last token"]["bytes_recv_per_call"] == H * 4
    total = sum(r["calls"] * max(r["bytes_sent_per_call"], r["bytes_recv_per_call"]) for r in j["decode"]["comm"])
    assert total == pytest.approx(j["decode"]["comm_bytes_per_rank"])
    # time = bytes / link + 5 us per call, link 25 GB/s
    for r in j["decode"]["comm"]:
        b = max(r["bytes_sent_per_call"], r["bytes_recv_per_call"])
        assert r["ms"] == pytest.approx(r["calls"] * (b / 25e9 + 5e-6) * 1e3)
    # experts: top_k / ep experts per token per layer, 3 * 1536 * 4096 weights each
    ffn_b = 2 if quant == "bf16" else 17 / 32
    assert j["decode"]["memory_bytes_per_rank"]["experts"] == pytest.approx(L * 8 / ranks * 3 * 1536 * H * ffn_b)
    assert j["decode"]["total_ms"] == pytest.approx(j["decode"]["compute_ms"] + j["decode"]["comm_ms"])


def test_single_rank_has_no_communication(tiny, work):
    j = plan_json(["plan", "-m", tiny, "--ranks", "1"], work)
    assert j["decode"]["comm"] == [] and j["prefill"]["comm"] == [] and j["decode"]["comm_ms"] == 0


# ------------------------------------------------------------------ bad

def test_unknown_yaml_key_names_key_and_line(tiny, work):
    y = yaml_file(work, "parallel_config:\n  attn_tp_size: 2\n  expert_parallel: 2\n")
    fails(["plan", "-m", tiny, "--ranks", "2", "--config", y], "expert_parallel", "run.yaml:3")


def test_unknown_top_level_key(tiny, work):
    y = yaml_file(work, f"model_path: {tiny}\nbatch_size: 4\n")
    fails(["plan", "--ranks", "2", "--config", y], "batch_size", "run.yaml:2")


@pytest.mark.parametrize("line,key", [
    ("  attn_tp_size: four", "parallel_config.attn_tp_size"),
    ("  moe_ep_size: \"2\"", "parallel_config.moe_ep_size"),
    ("  lmhead_tp_size: [2]", "parallel_config.lmhead_tp_size"),
    ("  moe_ep_comm: ring", "parallel_config.moe_ep_comm"),
    ("  comm_quant: {a: 1}", "parallel_config.comm_quant"),
])
def test_wrong_yaml_type_names_key_and_line(tiny, work, line, key):
    y = yaml_file(work, "# plan\nparallel_config:\n" + line + "\n")
    fails(["plan", "-m", tiny, "--ranks", "2", "--config", y], key, "run.yaml:3")


def test_yaml_syntax_error(tiny, work):
    y = yaml_file(work, "parallel_config: {attn_tp_size: 2\n")
    fails(["plan", "-m", tiny, "--ranks", "2", "--config", y], "run.yaml", "YAML syntax error")


def test_missing_yaml_file(tiny, work):
    fails(["plan", "-m", tiny, "--ranks", "2", "--config", work / "absent.yaml"], "absent.yaml")


@pytest.mark.parametrize("args,must", [
    (["--ranks", "3"], ["attn_tp_size", "num_attention_heads % attn_tp_size == 0"]),
    (["--ranks", "4", "--attn-tp", "3"], ["attn_tp_size", "world_size % attn_tp_size == 0"]),
    (["--ranks", "4", "--moe-ep", "3"], ["moe_ep_size", "world_size % moe_ep_size == 0"]),
    (["--ranks", "4", "--moe-ep", "4", "--moe-tp", "2"], ["moe_tp_size", "moe_tp_size * moe_ep_size == world_size"]),
    (["--ranks", "32", "--attn-tp", "8"], ["moe_ep_size", "num_experts % moe_ep_size == 0"]),
    (["--ranks", "8", "--attn-tp", "8", "--moe-tp", "8", "--quant", "w4a8"],
     ["moe_tp_size", "(moe_intermediate_size / moe_tp_size) % 32 == 0"]),
    (["--ranks", "4", "--lmhead-tp", "3"], ["lmhead_tp_size", "world_size % lmhead_tp_size == 0"]),
])
def test_rule_violations_name_the_key(tiny, args, must):
    fails(["plan", "-m", tiny] + args, *must, code=1)


def test_mx_rule_only_with_mx_weights(tiny):
    ok(["plan", "-m", tiny, "--ranks", "8", "--attn-tp", "8", "--moe-tp", "8"])   # 16 columns, bf16: fine


@pytest.mark.parametrize("args,must", [
    (["--ranks", "2", "--attn-tp", "0"], ["--attn-tp", "attn_tp_size"]),
    (["--ranks", "2", "--comm-quant", "fp4"], ["--comm-quant", "fp4"]),
    (["--ranks", "2", "--moe-ep-comm"], ["--moe-ep-comm"]),
    (["--ranks", "2", "--quant", "q4_0"], ["--quant", "q4_0"]),
    (["--ranks", "0"], ["--ranks"]),
    ([], ["--ranks"]),
    (["--ranks", "2", "--bogus"], ["--bogus"]),
])
def test_bad_flags(tiny, args, must):
    fails(["plan", "-m", tiny] + args, *must, code=2)


def test_missing_model(work):
    fails(["plan", "--ranks", "2"], "-m")
    fails(["plan", "--ranks", "2", "-m", work / "nowhere"], "nowhere")


def test_bad_config_json_is_rejected_naming_the_field(tiny, work):
    d = work / "ckpt"
    d.mkdir()
    cfg = json.loads((tiny / "config.json").read_text())
    cfg["num_attention_heads"] = "many"
    (d / "config.json").write_text(json.dumps(cfg))
    fails(["plan", "-m", d, "--ranks", "2"], "num_attention_heads")
    del cfg["num_attention_heads"]
    (d / "config.json").write_text(json.dumps(cfg))
    fails(["plan", "-m", d, "--ranks", "2"], "num_attention_heads")


def test_json_file_not_overwritten_without_force(tiny, work):
    out = work / "plan.json"
    out.write_text("keep")
    fails(["plan", "-m", tiny, "--ranks", "2", "--json", out], "exists")
    assert out.read_text() == "keep"
