"""`q3moe bench --comm-stats`: per phase and collective kind, the calls and
link bytes the comm layer counted during the timed runs, and per layer
compute vs comm time, in the table and the --json report.

At 2 ranks on a tiny synthesized model, the measured bytes (and calls) per
decode token and per prompt equal what `q3moe plan --json` predicts for
the same plan, prompt length and sampling (both use q3_comm_payload's link
bytes and q3_sampler_cands_per_rank's candidate count). On one rank every
count is zero and the table says so.
"""
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

import mpi_run

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))
P_LEN, STEPS, REPS, DEPTH, LAYERS = 16, 4, 2, 8, 2

# name: (parallel_config, compare prefill too). Prefill is compared only where
# plan predicts no sequence-parallel prefill (attn_tp != moe_ep) unless the
# engine runs it: the engine prefills replicated today.
PLANS = {
    "tp_ep": ({"attn_tp_size": 2, "moe_ep_size": 2, "lmhead_tp_size": 2}, False),
    "moe_tp": ({"attn_tp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1, "lmhead_tp_size": 2}, True),
}


def run(cmd, timeout=300):
    return mpi_run.run(cmd, timeout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    d = tmp_path_factory.mktemp("cs") / "tiny"
    run([Q3MOE, "synth", "-o", d, "--preset", "tiny", "--layers", LAYERS, "--vocab", 2048, "--tokenizer", "none"])
    return d


def bench(model, tmp, prefix=(), extra=()):
    out = tmp / "bench.json"
    stdout, err = run(list(prefix) + [Q3MOE, "bench", "-m", model, "-p", P_LEN, "-n", STEPS, "-r", REPS, "--depth",
                                      DEPTH, "-t", 1, "--no-membw", "--no-ttft", "--comm-stats", "--json", out,
                                      "--force"] + list(extra))
    return json.loads(out.read_text()), stdout, err


def predicted(plan_json, phase):
    """Calls and bytes sent per token (decode) or prompt (prefill), per kind."""
    want = defaultdict(lambda: [0.0, 0.0])
    for r in plan_json[phase]["comm"]:
        want[r["collective"]][0] += r["calls"]
        want[r["collective"]][1] += r["calls"] * r["bytes_sent_per_call"]
    return dict(want)


def measured(phase_json):
    return {k: [v["calls"], v["bytes_sent"]] for k, v in phase_json["collectives"].items()}


def check_layers(phase_json):
    assert len(phase_json["layers"]) == LAYERS
    for l in phase_json["layers"]:
        assert l["wall_ms"] > 0 and l["comm_ms"] >= 0
        assert l["compute_ms"] == pytest.approx(l["wall_ms"] - l["comm_ms"])
    total = sum(l["wall_ms"] for l in phase_json["layers"]) + phase_json["outside_layers"]["wall_ms"]
    assert total == pytest.approx(phase_json["wall_ms"])


@pytest.mark.parametrize("name", sorted(PLANS))
def test_two_ranks_match_plan(name, model, tmp_path):
    cfg, with_prefill = PLANS[name]
    y = tmp_path / "run.yaml"
    y.write_text(f"model_path: {model}\nparallel_config:\n" + "".join(f"  {k}: {v}\n" for k, v in cfg.items()))
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.fail("mpirun not found: install OpenMPI (tools/setup.sh does it)")
    r, stdout, err = bench(model, tmp_path, [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", 2],
                           ["--config", y])
    plan_out = tmp_path / "plan.json"
    run([Q3MOE, "plan", "--ranks", 2, "--config", y, "--prompt", P_LEN, "--json", plan_out, "--force"])
    plan = json.loads(plan_out.read_text())

    assert stdout.count("communication (rank 0 of 2") == 1, stdout   # rank 0 prints, once
    cs = r["comm_stats"]
    dec = cs["decode"]
    assert dec["per"] == "token" and dec["units_measured"] == STEPS * REPS
    got, want = measured(dec), predicted(plan, "decode")
    print(f"{name}: decode bytes sent per token measured {dec['bytes_sent']:.0f}, plan "
          f"{plan['decode']['comm_bytes_per_rank']:.0f}")
    assert set(got) == set(want), (got, want)
    for kind in want:
        assert got[kind] == pytest.approx(want[kind]), f"decode {kind}: measured {got[kind]}, plan {want[kind]}"
    assert dec["bytes_sent"] == pytest.approx(plan["decode"]["comm_bytes_per_rank"])
    check_layers(dec)
    assert dec["comm_ms"] > 0

    pre = cs["prefill"][0]
    assert pre["tokens"] == P_LEN and pre["per"] == "prompt" and pre["units_measured"] == REPS
    check_layers(pre)
    if with_prefill:
        assert plan["plan"]["sp_prefill"] is False
        got, want = measured(pre), predicted(plan, "prefill")
        assert set(got) == set(want), (got, want)
        for kind in want:
            assert got[kind] == pytest.approx(want[kind]), f"prefill {kind}: measured {got[kind]}, plan {want[kind]}"


def test_two_ranks_alltoall_match_plan(model, tmp_path):
    """AlltoAll EP: decode (tokens replicated, shared out over the EP ranks) and SP prefill run the
    collectives plan predicts, call for call; every byte count but the alltoallv rows (which follow
    the routing; plan gives uniform routing's expectation) is exact."""
    y = tmp_path / "run.yaml"
    y.write_text(f"model_path: {model}\nparallel_config:\n  attn_tp_size: 2\n  moe_ep_size: 2\n  lmhead_tp_size: 2\n"
                 "  moe_ep_comm: alltoall\n")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.fail("mpirun not found: install OpenMPI (tools/setup.sh does it)")
    r, _, _ = bench(model, tmp_path, [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", 2], ["--config", y])
    plan_out = tmp_path / "plan.json"
    run([Q3MOE, "plan", "--ranks", 2, "--config", y, "--prompt", P_LEN, "--json", plan_out, "--force"])
    plan = json.loads(plan_out.read_text())
    assert plan["plan"]["moe_ep_comm"] == "alltoall"
    for phase, got in (("decode", r["comm_stats"]["decode"]), ("prefill", r["comm_stats"]["prefill"][0])):
        got, want = measured(got), predicted(plan, phase)
        assert set(got) == set(want) and "alltoallv" in want, (phase, got, want)
        for kind in want:
            assert got[kind][0] == pytest.approx(want[kind][0]), f"{phase} {kind} calls: {got[kind]}, plan {want[kind]}"
            if kind == "alltoallv":
                assert 0.5 * want[kind][1] <= got[kind][1] <= 1.5 * want[kind][1], f"{phase}: {got[kind]}, plan {want[kind]}"
            else:
                assert got[kind][1] == pytest.approx(want[kind][1]), f"{phase} {kind}: {got[kind]}, plan {want[kind]}"


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
def test_two_ranks_count_expert_reads(comm, model, tmp_path):
    """Every decode token reads top_k experts per layer, however the experts
    are split and exchanged (AlltoAll EP counted none before)."""
    c = json.loads((model / "config.json").read_text())
    y = tmp_path / "run.yaml"
    y.write_text(f"model_path: {model}\nparallel_config:\n  attn_tp_size: 2\n  moe_ep_size: 2\n  moe_ep_comm: {comm}\n")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.fail("mpirun not found: install OpenMPI (tools/setup.sh does it)")
    r, _, _ = bench(model, tmp_path, [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", 2], ["--config", y])
    assert r["decode"]["expert_reads_per_token"] == c["num_experts_per_tok"] * LAYERS


def test_single_rank_shows_zeros(model, tmp_path):
    r, stdout, _ = bench(model, tmp_path)
    assert "one rank, nothing crosses a link, all zero" in stdout, stdout
    cs = r["comm_stats"]
    assert cs["decode"]["collectives"] == {} and cs["decode"]["bytes_sent"] == 0 and cs["decode"]["comm_ms"] == 0
    assert cs["prefill"][0]["bytes_sent"] == 0
    check_layers(cs["decode"])
    assert r["ranks"] == 1


def test_help_documents_comm_stats():
    out, _ = run([Q3MOE, "bench", "--help"])
    assert "--comm-stats" in out and "--config FILE" in out and "--top-k" in out
