"""Distributed sampling over a vocab-parallel lm_head (`generate` under
mpirun with lmhead_tp_size > 1): each rank sends only its candidates (its
argmax when greedy, its top-k best otherwise), every rank draws the same
token from the same seeded RNG, and the ids equal the single rank's for
greedy and for seeded top-k/top-p/min-p/temperature sampling with a
repetition penalty, at 2 and 4 ranks. With top-k off whole logits rows
are gathered (the documented fallback) and the ids still match.

Bytes: the comm layer's counters (`generate --comm-stats`, rank 0) show,
per decode step, one allgather over the lmhead group of k (id, logit) pairs
of 8 bytes: (L - 1) * 8 k link bytes sent, against (L - 1) * 4 V / L for
the whole row (src/parallel/comm.h's allgather formula).
"""
import json
import os
import re
import shutil
from pathlib import Path

import pytest

import mpi_run

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE", str(REPO / "build" / "q3moe"))
VOCAB, N_NEW = 4096, 16
PROMPT = "5,17,900,3,44"
CAND_BYTES = 8   # q3_sample_cand: float logit + int32 id

# name: (ranks, plan flags, sequence-parallel prefill); lmhead_tp_size = ranks in both
PLANS = {
    "2ranks": (2, ["--lmhead-tp", "2"], True),                                   # attn TP 2, MoE EP 2
    "4ranks": (4, ["--attn-tp", "1", "--moe-ep", "4", "--lmhead-tp", "4"], False),
}
# name: (sampling flags, candidates per rank; 0 = whole rows)
SAMPLING = {
    "greedy": (["--temp", "0", "--repeat-penalty", "1.2"], 1),
    "topk_topp_minp": (["--temp", "0.9", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.02",
                        "--repeat-penalty", "1.15", "--seed", "1234"], 40),
    "hot_topk5": (["--temp", "2.5", "--top-k", "5", "--top-p", "1", "--seed", "99"], 5),
    "topk_off_full_rows": (["--temp", "1.0", "--top-k", "0", "--top-p", "0.9", "--seed", "7"], 0),
}


def run(cmd, timeout=120):
    return mpi_run.run(cmd, timeout)


def mpi(np_):
    m = shutil.which("mpirun")
    if not m:
        pytest.fail("mpirun not found: install OpenMPI (tools/setup.sh does it)")
    return [m, "--allow-run-as-root", "--oversubscribe", "-np", np_]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    d = tmp_path_factory.mktemp("dist") / "moe"
    run([Q3MOE, "synth", "-o", d, "--preset", "tiny", "--layers", "2", "--vocab", VOCAB, "--tokenizer", "none",
         "--seed", 21])
    return d


STAT = re.compile(r"^\s+(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s*$")


def stats(err, phase, kind):
    for line in err.splitlines():
        m = STAT.match(line)
        if m and m.group(1) == phase and m.group(2) == kind:
            return int(m.group(3)), int(m.group(4)), int(m.group(5))
    return 0, 0, 0


def generate(model, sampling, prefix=(), extra=()):
    args = ["generate", "-m", model, "--ids", PROMPT, "-n", N_NEW, "--print-ids", "--ignore-eos", "-t", 1]
    return run(list(prefix) + [Q3MOE] + args + SAMPLING[sampling][0] + list(extra))


@pytest.fixture(scope="module")
def single(model):
    return {s: json.loads(generate(model, s)[0]) for s in SAMPLING}


@pytest.mark.parametrize("sampling", sorted(SAMPLING))
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_ids_and_bytes_match(plan, sampling, model, single):
    np_, flags, sp = PLANS[plan]
    out, err = generate(model, sampling, mpi(np_), flags + ["--comm-stats"])
    got = json.loads(out)
    assert len(got) == N_NEW
    assert got == single[sampling], f"{plan} {sampling}: ids differ from one rank\n{got}\n{single[sampling]}"

    L, k = np_, SAMPLING[sampling][1]
    full_row = (L - 1) * 4 * (VOCAB // L)
    per_step = (L - 1) * CAND_BYTES * k if k else full_row
    if k:
        assert re.search(rf"sampling: distributed over the {L} lm_head ranks, {k} candidates? per rank", err), err[-3000:]
        assert per_step * 10 < full_row, "candidates must be far below the whole row"
    else:
        assert "sampling: whole logits rows gathered" in err, err[-3000:]
    # The only decode allgathers of these plans are the lm_head's (the MoE sums by
    # allreduce): one per decode step (N_NEW - 1 steps); without sequence-parallel
    # prefill (which allgathers hidden rows) also the only one of the prefill.
    calls, sent, recv = stats(err, "decode", "allgather")
    print(f"{plan} {sampling}: {sent / calls:.0f} bytes sent per decode step (whole row: {full_row})")
    assert (calls, sent, recv) == (N_NEW - 1, (N_NEW - 1) * per_step, (N_NEW - 1) * per_step), err[-3000:]
    if not sp:
        assert stats(err, "prefill", "allgather") == (1, per_step, per_step), err[-3000:]
