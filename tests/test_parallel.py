"""Many ranks over MPI: `mpirun -np P q3moe logits|generate --config X.yaml`
against the single-rank run on small synthesized checkpoints.

For each plan (attention TP 2 and 4 with KV-head replication, MoE TP,
MoE EP 2 and 4, lm_head TP, dense-MLP split, a combined YAML plan, MX
weights from a .q3m):
- `logits` with the whole prompt in one prefill, with --prefill 1 (every
  token a decode step) and with one final decode step, max|delta| <=
  1e-4 * max(1, max|logit|) against the single-rank logits; the prompt
  length (11) is not a multiple of any rank count;
- the comm byte counters of that one decode step (`--comm-stats`, rank 0)
  equal the analytic link bytes (src/parallel/comm.h) of the collectives
  one decode token needs: per layer an allreduce of H fp32 over the
  attn_tp group after attention, one over the world after a MoE layer (or
  over attn_tp after a dense MLP), and an allgather of V/L fp32 over the
  lmhead group;
- greedy `generate` ids identical to the single rank's.
Plans with attn_tp_size == moe_ep_size > 1 run prefill sequence-parallel
(SP+TP: tokens split over the attn_tp group, src/model/forward.c); the cases
above then cover it at 2 and 4 ranks with both EP exchanges, KV-head
replication, a dense layer and moe_tp replicas, and a decode step after an
SP prefill. The SP tests below add:
- the prefill's comm counters (rank 0) against the analytic link bytes of
  every collective SP prefill runs, for prompts of 11 and 2 tokens (at 4
  ranks two of them hold only padding), with comm_quant none and mxfp8 (the
  byte formula then counts the MXFP8 wire rows, q3_comm_wire_row_bytes);
- comm_quant mxfp8 on BF16 weights: the logits move away from the
  single-rank ones by far more than fp32 noise, and agree within the
  quantized reference tolerance of tests/test_quant_reference.py (1e-3
  relative) with tools/reference.py taking exactly the payloads the engine
  sends through MXFP8 (the normed rows before q/k/v and the MLP, the
  attention output before o_proj); with MX weights and MXFP8 activations
  (.q3m) those payloads are already MXFP8 values, so the run must equal the
  single rank to 1e-4.
Bad plans are refused before any weight is read (checked on a directory
holding only config.json), naming the key, with a non-zero mpirun status.
"""
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import sys

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import reference  # noqa: E402
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))
JOB_TIMEOUT_S = 60
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_mpi_yield_when_idle": "1"}
IDS = [5, 17, 900, 3, 44, 12, 7, 1000, 256, 31, 8]   # 11: no rank count divides it
VOCAB = 1024

MODELS = {
    # all-MoE tiny: 8 heads / 4 KV heads, 16 experts top-4, H 256
    "moe": ["--preset", "tiny", "--layers", "2", "--vocab", str(VOCAB)],
    # 8 heads / 2 KV heads (attn_tp 4 replicates each KV head on 2 ranks),
    # layer 1 a dense MLP
    "kv2_mixed": ["--preset", "tiny", "--layers", "2", "--vocab", str(VOCAB), "--heads", "8", "--kv-heads", "2",
                  "--head-dim", "32", "--mlp-only-layers", "1"],
    # dense Qwen3
    "dense": ["--preset", "tiny-dense", "--layers", "2", "--vocab", str(VOCAB)],
}

# name: (model, ranks, plan flags or {"yaml": parallel_config}, check greedy generate)
CASES = {
    "attn_tp2": ("moe", 2, ["--attn-tp", "2", "--lmhead-tp", "1"], True),
    "attn_tp4_kv_replicated": ("kv2_mixed", 4, ["--attn-tp", "4", "--lmhead-tp", "1"], True),
    "moe_tp2": ("moe", 2, ["--attn-tp", "1", "--moe-tp", "2", "--lmhead-tp", "1"], False),
    "moe_ep2": ("moe", 2, ["--attn-tp", "1", "--moe-ep", "2", "--lmhead-tp", "1"], False),
    "moe_ep4": ("moe", 4, ["--attn-tp", "1", "--moe-ep", "4", "--lmhead-tp", "1"], True),
    "lmhead_tp2": ("moe", 2, ["--attn-tp", "1", "--moe-ep", "2", "--lmhead-tp", "2"], False),
    "dense_attn_tp2": ("dense", 2, ["--attn-tp", "2"], True),
    "combined_yaml": ("kv2_mixed", 4, {"yaml": {"attn_tp_size": 2, "moe_ep_size": 2, "moe_tp_size": 2,
                                                "lmhead_tp_size": 4}}, True),
    "mx_q3m": ("kv2_mixed.q3m", 2, ["--attn-tp", "2", "--moe-tp", "2"], False),
    # W4A8i (MXINT8 attention and inputs, the integer GEMV): MXINT8 column slices, EP over AlltoAll
    "mxi_q3m": ("kv2_mixed.w4a8i.q3m", 2, ["--attn-tp", "2", "--moe-tp", "2"], False),
    "mxi_q3m_ep2_alltoall": ("kv2_mixed.w4a8i.q3m", 2, ["--attn-tp", "2", "--moe-ep", "2", "--moe-ep-comm", "alltoall"], True),
    # BF16P: packed column slices (o_proj, down at 64 columns), then down slices of 32 columns (copied as BF16)
    "bf16p_q3m": ("kv2_mixed.bf16p.q3m", 2, ["--attn-tp", "2", "--moe-tp", "2"], False),
    "bf16p_q3m_tp4": ("kv2_mixed.bf16p.q3m", 4, ["--attn-tp", "4", "--moe-tp", "4", "--lmhead-tp", "4"], False),
    # EP over AlltoAll (dispatch / combine alltoallv, then an allgather of the token shares)
    "moe_ep2_alltoall": ("moe", 2, ["--moe-ep", "2", "--moe-ep-comm", "alltoall"], True),
    "moe_ep4_alltoall": ("kv2_mixed", 4, ["--moe-ep", "4", "--moe-ep-comm", "alltoall", "--lmhead-tp", "2"], False),
    "ep2_tp2_alltoall_yaml": ("moe", 4, {"yaml": {"attn_tp_size": 2, "moe_ep_size": 2, "moe_tp_size": 2,
                                                  "moe_ep_comm": "alltoall"}}, True),
}


def mpirun():
    m = shutil.which("mpirun")
    if not m:
        pytest.fail("mpirun not found: install OpenMPI (tools/setup.sh does it)")
    return m


def run(cmd, ok=True, timeout=JOB_TIMEOUT_S):
    cmd = [str(c) for c in cmd]
    env = dict(os.environ)
    env.update(MPI_ENV)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (hang)\n{err.decode(errors='replace')[-3000:]}")
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-4000:]}"
    return proc.returncode, out, err


def mpi(np_, args):
    return [mpirun(), "--allow-run-as-root", "--oversubscribe", "-np", np_, Q3MOE] + list(args)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    root = tmp_path_factory.mktemp("par")
    paths = {}
    for i, (name, flags) in enumerate(sorted(MODELS.items())):
        d = root / name
        run([Q3MOE, "synth", "-o", d, "--tokenizer", "none", "--seed", 11 + i] + flags)
        paths[name] = d
    q = root / "kv2_mixed.q3m"
    run([Q3MOE, "convert", "-m", paths["kv2_mixed"], "-o", q])   # W4A8: MX column slices on each rank
    paths["kv2_mixed.q3m"] = q
    qi = root / "kv2_mixed.w4a8i.q3m"
    run([Q3MOE, "convert", "-m", paths["kv2_mixed"], "-o", qi, "--quant", "w4a8i", "--head", "mxint8"])
    paths["kv2_mixed.w4a8i.q3m"] = qi
    qp = root / "kv2_mixed.bf16p.q3m"
    run([Q3MOE, "convert", "-m", paths["kv2_mixed"], "-o", qp, "--quant", "bf16p"])
    paths["kv2_mixed.bf16p.q3m"] = qp
    return root, paths


def plan_args(case, tmp):
    plan = CASES[case][2]
    if isinstance(plan, dict):
        y = tmp / f"{case}.yaml"
        y.write_text("parallel_config:\n" + "".join(f"  {k}: {v}\n" for k, v in plan["yaml"].items()))
        return ["--config", y]
    return list(plan)


def logits(cmd_prefix, model, prefill, out, extra=()):
    cmd = cmd_prefix + ["logits", "-m", model, "--ids", ",".join(map(str, IDS)), "-o", out, "--force", "-t", "1"]
    if prefill is not None:
        cmd += ["--prefill", prefill]
    _, _, err = run(cmd + list(extra))
    return np.fromfile(out, dtype="<f4").reshape(len(IDS), -1), err


def config_of(model_path):
    p = Path(model_path)
    if p.is_dir():
        return json.loads((p / "config.json").read_text())
    return None


def expected_decode_bytes(cfg, world, sizes):
    """Calls and link bytes (sent) of one decode token, per collective kind
    (alltoallv: calls only, its bytes depend on the routing)."""
    attn, lmhead, ep, tp, alltoall = sizes
    H, V, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    moe = cfg.get("model_type") == "qwen3_moe"
    dense_layers = set(cfg.get("mlp_only_layers", [])) if moe else set(range(layers))
    step = cfg.get("decoder_sparse_step", 1) if moe else 1

    def allreduce(p, b):
        return 2 * (p - 1) * b // p if p > 1 else 0

    ar = ar_calls = ag = ag_calls = a2a_calls = 0
    for layer in range(layers):
        if attn > 1:
            ar += allreduce(attn, 4 * H)
            ar_calls += 1
        sparse = moe and layer not in dense_layers and (layer + 1) % step == 0
        if sparse and alltoall and ep > 1:
            a2a_calls += 2                       # dispatch + combine
            # the token's moe_tp column partials are summed by the last EP rank, whose share it is;
            # rank 0's share is empty (no allreduce)
            ag += (ep - 1) * 4 * H               # one token: a block of ceil(1 / ep) = 1 row
            ag_calls += 1
            continue
        g = world if sparse else attn
        if g > 1:
            ar += allreduce(g, 4 * H)
            ar_calls += 1
    if lmhead > 1:
        ag += (lmhead - 1) * 4 * (V // lmhead)
        ag_calls += 1
    want = {"allreduce_sum": (ar_calls, ar), "allgather": (ag_calls, ag)}
    if a2a_calls:
        want["alltoallv"] = (a2a_calls, None)
    return want


STAT = re.compile(r"^\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s*$")


def parse_stats(err, phase):
    got = {}
    for line in err.splitlines():
        m = STAT.match(line)
        if m and m.group(1) == phase:
            got[m.group(2)] = (int(m.group(3)), int(m.group(4)), int(m.group(5)))
    return got


def resolved_sizes(err):
    """attn_tp, lmhead_tp, moe_ep, moe_tp sizes and the EP exchange from the
    plan rank 0 prints."""
    got = []
    for key in ("attn_tp_size", "lmhead_tp_size", "moe_ep_size", "moe_tp_size"):
        m = re.search(r"^\s+" + key + r"\s+(\d+)", err, re.M)
        got.append(int(m.group(1)) if m else 1)
    assert re.search(r"^\s+attn_tp_size", err, re.M), f"no plan printed on stderr:\n{err[-2000:]}"
    m = re.search(r"^\s+moe_ep_comm\s+(\S+)", err, re.M)
    return tuple(got) + (bool(m and m.group(1) == "alltoall"),)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_single_rank(case, models, tmp_path):
    root, paths = models
    model_name, np_, _, _ = CASES[case]
    model = paths[model_name]
    args = plan_args(case, tmp_path)
    for prefill in (None, 1, len(IDS) - 1):
        ref, _ = logits([Q3MOE], model, prefill, tmp_path / "ref.bin")
        extra = ["--comm-stats"] + args if prefill == len(IDS) - 1 else args
        got, err = logits(mpi(np_, []), model, prefill, tmp_path / "par.bin", extra)
        tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
        delta = float(np.abs(got - ref).max())
        label = f"{case} (-np {np_}) prefill={prefill or 'all'}"
        print(f"{label}: max|delta| = {delta:.3g} (tolerance {tol:.3g})")
        assert delta <= tol, f"{label}: max|delta| {delta:.3g} > {tol:.3g}"
        assert err.count("parallel plan:") == 1, f"{label}: the plan must be printed once (rank 0):\n{err[-3000:]}"
        if prefill == len(IDS) - 1:
            cfg = config_of(model) or config_of(paths[model_name.split(".")[0]])
            sizes = resolved_sizes(err)
            assert sizes[4] == ("alltoall" in case), f"{label}: EP exchange in the plan: {sizes}"
            want = expected_decode_bytes(cfg, np_, sizes)
            stats = parse_stats(err, "decode")
            for kind, (calls, sent) in want.items():
                g = stats.get(kind, (0, 0, 0))
                if sent is None:
                    # The one decode token belongs to the last EP rank's share; rank 0 receives the
                    # rows of the r slots routed to its experts (H floats + the expert id) and sends
                    # r output rows of H back (r summed over the MoE layers).
                    assert g[0] == calls, f"{label}: decode {kind}: {g[0]} calls, expected {calls}\n{err[-3000:]}"
                    H, K = cfg["hidden_size"], cfg["num_experts_per_tok"]
                    rows = g[1] // (4 * H)
                    assert g[1] == 4 * H * rows and g[2] == 4 * H * rows and rows <= K * calls // 2, \
                        f"{label}: decode alltoallv sent/recv {g[1]}/{g[2]} is not r x 4H each way"
                    continue
                assert (g[0], g[1], g[2]) == (calls, sent, sent), \
                    f"{label}: decode {kind}: got calls/sent/recv {g}, expected {(calls, sent, sent)}\n{err[-3000:]}"
            assert set(stats) <= {k for k, v in want.items() if v[0]}, \
                f"{label}: unexpected decode collectives {sorted(stats)} (expected {want})"


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][3]))
def test_greedy_matches_single_rank(case, models, tmp_path):
    _, paths = models
    model_name, np_, _, _ = CASES[case]
    gen = ["generate", "-m", paths[model_name], "--ids", ",".join(map(str, IDS[:5])), "-n", 16, "--temp", 0,
           "--print-ids", "--ignore-eos", "-t", 1]
    _, want, _ = run([Q3MOE] + gen)
    _, got, _ = run(mpi(np_, gen + plan_args(case, tmp_path)))
    assert json.loads(got.strip()) == json.loads(want.strip()), f"{case}: greedy ids differ\n{got}\n{want}"


@pytest.fixture(scope="module")
def config_only(models):
    """A directory holding only the config.json of the MoE model: any attempt
    to read weights fails, so a plan error seen here came first."""
    root, paths = models
    d = root / "config_only"
    d.mkdir(exist_ok=True)
    shutil.copy(paths["moe"] / "config.json", d / "config.json")
    return d


BAD = {
    "attn_tp_not_dividing_world": (2, "attn_tp_size: 3", "attn_tp_size"),
    "experts_not_divisible": (3, "attn_tp_size: 1\n  lmhead_tp_size: 1\n  moe_ep_size: 3", "num_experts"),
    "tp_times_ep": (2, "moe_ep_size: 2\n  moe_tp_size: 2", "moe_tp_size"),
    "unknown_key": (2, "attn_tp: 2", "parallel_config.attn_tp"),
    "comm_quant_unknown": (2, "comm_quant: fp4", "comm_quant"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_plan_refused_before_weights(name, config_only, tmp_path):
    np_, body, key = BAD[name]
    y = tmp_path / "bad.yaml"
    y.write_text("parallel_config:\n  " + body + "\n")
    rc, out, err = run(mpi(np_, ["logits", "-m", config_only, "--ids", "1,2,3", "-o", tmp_path / "x.bin",
                                 "--config", y]), ok=False)
    assert rc != 0, f"{name}: mpirun exited 0\n{err}"
    assert key in err, f"{name}: the error does not name {key}:\n{err[-3000:]}"
    assert "safetensors" not in err, f"{name}: weights were looked for before the plan was checked:\n{err[-3000:]}"
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize("cmd,args,said", [("generate", ["--ids", "1,2,x"], "bad token id list"),
                                            ("generate", ["--ids", "1", "-n", "abc"], "not an integer"),
                                            ("generate", ["--ids", "1", "--bogus"], "unknown argument"),
                                            ("bench", ["-n", "abc"], "not an integer"),
                                            ("bench", ["--bogus"], "unknown argument")])
def test_argument_errors_said_once(models, cmd, args, said):
    """Every rank parses the same arguments: rank 0 alone reports a bad one."""
    _, paths = models
    rc, _, err = run(mpi(2, [cmd, "-m", paths["moe"], "-t", 1] + args), ok=False)
    assert rc != 0 and err.count(said) == 1, err[-3000:]


def test_membw_alone_is_one_rank(tmp_path):
    rc, _, err = run(mpi(2, ["bench", "--membw", "--membw-mb", 8, "-t", 1]), ok=False)
    assert rc != 0 and err.count("--membw alone measures this machine on one rank") == 1, err[-3000:]


def test_single_rank_command_refused_on_many(models, tmp_path):
    _, paths = models
    rc, _, err = run(mpi(2, ["tokenize", "-m", paths["moe"], "--decode", "--ids", "1"]), ok=False)
    assert rc != 0 and "runs on one rank" in err, err[-2000:]


# ------------------------------------------------------------ SP prefill

def wire_row(n, nq, quant):
    """Bytes of one row of n floats on the wire, its first nq as MXFP8 under
    comm_quant mxfp8 (elements + one E8M0 scale per 32), the rest fp32."""
    return nq + nq // 32 + 4 * (n - nq) if quant else 4 * n


def expected_sp_prefill(cfg, T, sizes, quant):
    """{kind: (calls, sent bytes or None)} of rank 0 for one SP prefill of T
    tokens with every row's logits (the logits command). alltoallv: calls
    only (its rows depend on the routing)."""
    attn, lmhead, ep, tp, alltoall = sizes
    H, V, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    Q, D = cfg["num_attention_heads"], cfg.get("head_dim") or H // cfg["num_attention_heads"]
    moe = cfg.get("model_type") == "qwen3_moe"
    K, N = cfg.get("num_experts_per_tok", 0), cfg.get("num_experts", 0)
    dense_layers = set(cfg.get("mlp_only_layers", [])) if moe else set(range(layers))
    P, sl = attn, -(-T // attn)
    nr0 = min(sl, T)                                  # rank 0's real rows
    want = {}

    def add(kind, sent, calls=1):
        c, b = want.get(kind, (0, 0))
        want[kind] = (c + calls, None if sent is None or b is None else b + sent)

    def allreduce(p, b):
        return 2 * (p - 1) * b // p if p > 1 else 0

    for layer in range(layers):
        add("allgather", (P - 1) * sl * wire_row(H, H, quant))                  # normed rows
        add("alltoall", (P - 1) * sl * wire_row(Q // P * D, Q // P * D, quant))  # attention output
        if not moe or layer in dense_layers:
            add("allgather", (P - 1) * sl * wire_row(H, H, quant))
            add("reduce_scatter_sum", (P - 1) * sl * 4 * H)
        elif alltoall:
            add("alltoall", (P - 1) * (N // P) * 4)                              # per-expert counts
            add("alltoallv", None, 2)                                            # dispatch, combine
            if tp > 1:
                add("allreduce_sum", allreduce(tp, nr0 * 4 * H))
        else:
            add("allgather", (P - 1) * sl * wire_row(H + 2 * K, H, quant))       # rows + ids + weights
            add("reduce_scatter_sum", (P - 1) * sl * 4 * H)
            if tp > 1:
                add("allreduce_sum", allreduce(tp, sl * 4 * H))
    add("allgather", (P - 1) * sl * 4 * H)                                       # final rows, fp32
    if lmhead > 1:
        for t0 in range(0, T, 16):                                               # Q3_LM_ROWS at a time
            add("allgather", (lmhead - 1) * min(16, T - t0) * 4 * (V // lmhead))
    return want


# name: (model, ranks, plan flags, prompt length)
SP_BYTES = {
    "tp2_ep2": ("moe", 2, ["--attn-tp", "2", "--lmhead-tp", "2"], 11),
    "tp4_kv_replicated_dense_layer": ("kv2_mixed", 4, ["--attn-tp", "4", "--lmhead-tp", "1"], 11),
    "tp4_two_empty_ranks": ("kv2_mixed", 4, ["--attn-tp", "4", "--lmhead-tp", "1"], 2),
    "tp4_alltoall": ("kv2_mixed", 4, ["--attn-tp", "4", "--moe-ep-comm", "alltoall", "--lmhead-tp", "2"], 11),
    "tp2_ep2_moe_tp2": ("moe", 4, ["--attn-tp", "2", "--moe-ep", "2", "--moe-tp", "2"], 11),
    "tp2_ep2_moe_tp2_alltoall": ("moe", 4, ["--attn-tp", "2", "--moe-ep", "2", "--moe-tp", "2",
                                            "--moe-ep-comm", "alltoall"], 11),
    "dense_tp2": ("dense", 2, ["--attn-tp", "2"], 11),
}


@pytest.mark.parametrize("quant", ["none", "mxfp8"])
@pytest.mark.parametrize("case", sorted(SP_BYTES))
def test_sp_prefill_bytes(case, quant, models, tmp_path):
    _, paths = models
    model_name, np_, flags, T = SP_BYTES[case]
    ids = ",".join(map(str, IDS[:T]))
    cmd = ["logits", "-m", paths[model_name], "--ids", ids, "-o", tmp_path / "par.bin", "--force", "-t", "1",
           "--comm-stats", "--comm-quant", quant] + flags
    _, _, err = run(mpi(np_, cmd))
    assert re.search(r"^\s+SP prefill\s+yes", err, re.M), f"{case}: SP prefill is not on:\n{err[-3000:]}"
    got_logits = np.fromfile(tmp_path / "par.bin", dtype="<f4").reshape(T, -1)
    if quant == "none":
        _, _, _ = run([Q3MOE, "logits", "-m", paths[model_name], "--ids", ids, "-o", tmp_path / "ref.bin", "-t", "1"])
        ref = np.fromfile(tmp_path / "ref.bin", dtype="<f4").reshape(T, -1)
        tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
        assert float(np.abs(got_logits - ref).max()) <= tol, case
    cfg = config_of(paths[model_name])
    sizes = resolved_sizes(err)
    want = expected_sp_prefill(cfg, T, sizes, quant == "mxfp8")
    stats = parse_stats(err, "prefill")
    assert set(stats) == set(want), f"{case}: prefill collectives {sorted(stats)}, expected {sorted(want)}\n{err[-3000:]}"
    H = cfg["hidden_size"]
    for kind, (calls, sent) in want.items():
        g = stats[kind]
        if sent is None:
            # alltoallv: rank 0 dispatches r_out rows (wire format) and gets their outputs back in
            # fp32; it receives r_in dispatched rows and returns r_in fp32 outputs. Both counts are
            # routing-dependent, but the bytes must split into whole rows of those formats.
            wb, fb = wire_row(H, H, quant == "mxfp8"), 4 * H
            assert g[0] == calls, f"{case}: prefill {kind}: {g[0]} calls, expected {calls}"
            K = cfg["num_experts_per_tok"]
            fits = [(ro, (g[1] - ro * wb) // fb) for ro in range(T * K * calls // 2 + 1)
                    if g[1] >= ro * wb and (g[1] - ro * wb) % fb == 0
                    and g[2] == ((g[1] - ro * wb) // fb) * wb + ro * fb]
            assert fits, f"{case}: prefill alltoallv sent/recv {g[1]}/{g[2]} are not whole rows of {wb} / {fb} B"
            print(f"{case} {quant}: prefill alltoallv sent/recv {g[1]}/{g[2]} = (rows out, rows in) {fits[0]} "
                  f"x ({wb} B dispatch, {fb} B combine)")
            continue
        print(f"{case} {quant}: prefill {kind}: calls {g[0]} sent {g[1]} recv {g[2]} (formula {calls} / {sent})")
        assert (g[0], g[1], g[2]) == (calls, sent, sent), \
            f"{case}: prefill {kind}: got calls/sent/recv {g}, expected {(calls, sent, sent)}\n{err[-3000:]}"


class CommQuantReference(reference.Model):
    """What SP prefill with comm_quant mxfp8 computes on BF16 weights (and
    decode with the AlltoAll exchange, whose dispatch is MXFP8 too): the
    normed rows reach q/k/v and the MLP (dense or experts, not the router)
    through MXFP8, the attention output reaches o_proj through MXFP8; the
    down_proj input, every sum and the lm_head path stay as they are."""
    quant = {"attn": True, "experts": True, "dense": True}

    def linear_in(self, group, x):
        return reference.fake_quant("mxfp8", x) if group == "attn" and self.quant["attn"] else x

    def mlp(self, prefix, h):
        on = self.quant["experts" if ".experts." in prefix else "dense"]
        return super().mlp(prefix, reference.fake_quant("mxfp8", h) if on else h)


# name: (model, ranks, plan flags, --prefill, exchange): the prefill runs SP
MXFP8 = {
    "tp2_ep2": ("moe", 2, ["--attn-tp", "2"], None, "allgather"),
    "tp2_ep2_then_decode": ("moe", 2, ["--attn-tp", "2"], 9, "allgather"),
    "tp4_alltoall_dense_layer": ("kv2_mixed", 4, ["--attn-tp", "4", "--moe-ep-comm", "alltoall", "--lmhead-tp", "2"],
                                 None, "alltoall"),
    "tp4_alltoall_then_decode": ("kv2_mixed", 4, ["--attn-tp", "4", "--moe-ep-comm", "alltoall"], 9, "alltoall"),
}


@pytest.mark.parametrize("case", sorted(MXFP8))
def test_comm_quant_mxfp8_matches_quantized_reference(case, models, tmp_path):
    _, paths = models
    model_name, np_, flags, prefill, exchange = MXFP8[case]
    model = paths[model_name]
    single, _ = logits([Q3MOE], model, prefill, tmp_path / "ref.bin")
    got, err = logits(mpi(np_, []), model, prefill, tmp_path / "par.bin", flags + ["--comm-quant", "mxfp8"])
    assert re.search(r"^\s+comm_quant\s+mxfp8", err, re.M) and re.search(r"^\s+SP prefill\s+yes", err, re.M), err[-3000:]
    ref_model = CommQuantReference(str(model))
    cache = ref_model.new_cache()
    n_pre = prefill or len(IDS)
    rows = [ref_model.forward(IDS[:n_pre], cache)]
    # decode steps: the attention and dense layers allreduce in fp32; AlltoAll still dispatches MXFP8
    ref_model.quant = {"attn": False, "experts": exchange == "alltoall", "dense": False}
    for i in range(n_pre, len(IDS)):
        rows.append(ref_model.forward(IDS[i:i + 1], cache))
    ref = np.concatenate(rows)
    scale = max(1.0, float(np.abs(ref).max()))
    moved = float(np.abs(got - single).max())
    delta = float(np.abs(got - ref).max())
    print(f"{case}: comm_quant mxfp8: max|delta| vs single rank {moved:.3g}, vs quantized reference {delta:.3g} "
          f"(scale {scale:.3g})")
    # quantization happened: far beyond the 1e-4 agreement of the unquantized runs ...
    assert moved > 10 * 1e-4 * scale, f"{case}: mxfp8 changed the logits by only {moved:.3g}"
    # ... and it is exactly the MXFP8 of those payloads (test_quant_reference.py's tolerance)
    assert delta <= 1e-3 * scale, f"{case}: max|delta| {delta:.3g} vs the quantized reference > {1e-3 * scale:.3g}"


@pytest.mark.parametrize("exchange", ["allgather", "alltoall"])
def test_comm_quant_mxfp8_is_lossless_on_mxfp8_activations(exchange, models, tmp_path):
    """W4A8 .q3m: every quantized payload feeds an MX linear whose input is
    MXFP8 anyway, so quantizing it on the wire changes nothing."""
    _, paths = models
    model = paths["kv2_mixed.q3m"]
    flags = ["--attn-tp", "2", "--moe-ep", "2", "--comm-quant", "mxfp8", "--moe-ep-comm", exchange]
    for prefill in (None, len(IDS) - 1):
        ref, _ = logits([Q3MOE], model, prefill, tmp_path / "ref.bin")
        got, err = logits(mpi(2, []), model, prefill, tmp_path / "par.bin", flags)
        assert re.search(r"^\s+SP prefill\s+yes", err, re.M), err[-3000:]
        tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
        delta = float(np.abs(got - ref).max())
        print(f"W4A8 {exchange} prefill={prefill or 'all'}: comm_quant mxfp8 max|delta| {delta:.3g} (tolerance {tol:.3g})")
        assert delta <= tol


def test_no_sp_note_printed_once(models, tmp_path):
    _, paths = models
    _, err = logits(mpi(4, []), paths["moe"], None, tmp_path / "par.bin",
                    ["--attn-tp", "4", "--moe-ep", "2", "--moe-tp", "2"])
    assert err.count("no sequence-parallel prefill: it needs attn_tp_size == moe_ep_size (here 4 and 2)") == 1, err


def test_hugepages_left_to_one_process(models, tmp_path):
    """--hugepages would copy the whole model into every rank: ranks map it instead, say so once,
    and give the single-process greedy ids."""
    _, paths = models
    gen = ["generate", "-m", paths["moe"], "--ids", ",".join(map(str, IDS[:5])), "-n", 4, "--temp", 0,
           "--print-ids", "--ignore-eos", "-t", 1]
    _, want, _ = run([Q3MOE] + gen)
    _, got, err = run(mpi(2, gen + ["--hugepages", "--moe-ep", "2"]))
    assert json.loads(got.strip()) == json.loads(want.strip())
    assert err.count("--hugepages is for one process; the 2 ranks map the model") == 1, err


def test_quant_cache_filled_once_across_ranks(models, tmp_path, monkeypatch):
    """-m DIR --quant on 2 ranks: rank 0 converts into the cache while the other waits (one
    conversion, one cached file), the ranks run the cached file as they run the same scheme's
    .q3m, and a second job says it uses the cache, once. (The wait is not watched by the
    collectives' timeout: test_comm.py's test_unwatched_wait_outlasts_the_timeout.)"""
    _, paths = models
    monkeypatch.setenv("Q3MOE_CACHE_DIR", str(tmp_path / "cache"))
    q = tmp_path / "w4a8.q3m"
    run([Q3MOE, "convert", "-m", paths["kv2_mixed"], "-o", q, "--quant", "w4a8"])
    plan = ["--attn-tp", "2", "--moe-ep", "2"]
    want, _ = logits(mpi(2, []), q, None, tmp_path / "want.bin", plan)
    got, err = logits(mpi(2, []), paths["kv2_mixed"], None, tmp_path / "got.bin", plan + ["--quant", "w4a8"])
    assert np.array_equal(got, want)
    assert err.count("[q3moe] converting") == 1, err
    assert len(list((tmp_path / "cache").glob("*.q3m"))) == 1
    again, err = logits(mpi(2, []), paths["kv2_mixed"], None, tmp_path / "again.bin", plan + ["--quant", "w4a8"])
    assert np.array_equal(again, want)
    assert err.count("[q3moe] using cached") == 1 and "converting" not in err, err
