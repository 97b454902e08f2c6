"""The comm layer (src/parallel/comm.h) under a real MPI job.

Builds tests/mpi/comm_check.c (`make build/tests-mpi/comm_check`) and runs
it with `mpirun --oversubscribe -np N`:

- every collective's result is checked element for element by each rank
  (the program exits non-zero on any mismatch);
- each rank's byte counters must equal the link-byte formulas of comm.h,
  computed here independently from the payload sizes comm_check uses
  (mirrored below: change both together);
- failure drills: a rank calling q3_comm_abort, a rank exiting without
  finalizing, and a rank stalling while the others wait in a collective
  (the watchdog, Q3MOE_COMM_TIMEOUT=2) must each end the whole job with a
  non-zero status and the reason printed, well inside 60 s.

MPI is a build requirement (tools/setup.sh installs libopenmpi-dev and
openmpi-bin): without mpirun or the MPI build these tests fail, they do not
skip.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = os.path.join(ROOT, "build", "tests-mpi", "comm_check")
JOB_TIMEOUT_S = 60
BUILD_TIMEOUT_S = 900
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           # keep a shared 2-core machine usable: no busy-polling while waiting
           "OMPI_MCA_mpi_yield_when_idle": "1"}
DRILL_VARS = ("Q3_COMM_CHECK_ABORT_RANK", "Q3_COMM_CHECK_EXIT_RANK", "Q3_COMM_CHECK_STALL_RANK",
              "Q3MOE_COMM_TIMEOUT", "Q3_COMM_CHECK_LONG_WAIT")


@pytest.fixture(scope="module")
def comm_check():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.fail("mpirun not found: install OpenMPI (openmpi-bin, libopenmpi-dev; tools/setup.sh does it)")
    pc = subprocess.run(["pkg-config", "--exists", "ompi-c"], capture_output=True)
    if pc.returncode != 0:
        pytest.fail("pkg-config cannot find ompi-c: install libopenmpi-dev (tools/setup.sh does it)")
    p = subprocess.run(["make", "--no-print-directory", "build/tests-mpi/comm_check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert p.returncode == 0, f"make build/tests-mpi/comm_check failed:\n{p.stdout}\n{p.stderr}"
    return mpirun


def run_job(mpirun, n, env_extra=None, timeout=JOB_TIMEOUT_S):
    """Run comm_check on n ranks in its own process group; on timeout kill
    the whole group (mpirun and every rank) and fail."""
    env = {k: v for k, v in os.environ.items() if k not in DRILL_VARS}
    env.update(MPI_ENV)
    env.update(env_extra or {})
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
    for k in (env_extra or {}):
        cmd += ["-x", k]
    cmd.append(PROG)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (hang)\n"
                    f"stdout:\n{out.decode(errors='replace')[-3000:]}\nstderr:\n{err.decode(errors='replace')[-3000:]}")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - start


def shown(rc, out, err):
    return f"exit {rc}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"


# ------------------------------------------------------ expected counters

def link_bytes(kind, p, b, root=False):
    """comm.h's convention: bytes this rank sends / receives in one call."""
    if p <= 1:
        return 0, 0
    if kind == "allreduce_sum":
        v = 2 * (p - 1) * b // p
        return v, v
    if kind in ("allgather", "reduce_scatter_sum", "alltoall"):
        return (p - 1) * b, (p - 1) * b
    if kind == "broadcast":
        return (b, 0) if root else (0, b)
    if kind == "barrier":
        return 0, 0
    raise ValueError(kind)


def expected_counters(r, p):
    """{(phase, kind): (calls, sent, recv)} for rank r of p, from the
    payloads tests/mpi/comm_check.c uses."""
    exp = {}

    def add(phase, kind, sent_recv):
        calls, s, v = exp.get((phase, kind), (0, 0, 0))
        exp[(phase, kind)] = (calls + 1, s + sent_recv[0], v + sent_recv[1])

    f = 4  # float
    add("prefill", "allreduce_sum", link_bytes("allreduce_sum", p, 7 * f))
    add("prefill", "allgather", link_bytes("allgather", p, 5 * f))
    add("prefill", "allgather", link_bytes("allgather", p, 5 * f))          # in place
    add("prefill", "reduce_scatter_sum", link_bytes("reduce_scatter_sum", p, 3 * f))
    add("prefill", "alltoall", link_bytes("alltoall", p, 2 * f))

    def v_counts(send, recv, elem):
        if p == 1:
            return 0, 0
        return (sum(send(j) for j in range(p) if j != r) * elem,
                sum(recv(j) for j in range(p) if j != r) * elem)

    add("decode", "alltoallv", v_counts(lambda j: (r + j) % 3 + 1, lambda j: (j + r) % 3 + 1, f))
    add("decode", "broadcast", link_bytes("broadcast", p, 6 * f, root=(r == p - 1)))
    add("decode", "allgather", link_bytes("allgather", p, 33))
    add("decode", "alltoall", link_bytes("alltoall", p, 4))
    add("decode", "alltoallv", v_counts(lambda j: (2 * r + j) % 4 + 1, lambda j: (2 * j + r) % 4 + 1, 1))
    add("decode", "broadcast", link_bytes("broadcast", p, 9, root=(r == 0)))
    add("decode", "barrier", (0, 0))

    # rows collectives: link bytes of the wire rows (32 MXFP8 elements + 1 scale byte + the fp32 tail)
    add("quant", "allgather", link_bytes("allgather", p, 3 * (32 + 1 + 8 * f)))
    add("quant", "alltoall", link_bytes("alltoall", p, 2 * (64 + 2)))
    add("quant", "alltoallv", v_counts(lambda j: (r + j) % 2 + 1, lambda j: (j + r) % 2 + 1, 32 + 1))
    add("quant", "alltoallv", v_counts(lambda j: (r + 2 * j) % 3, lambda j: (j + 2 * r) % 3, 5 * f))

    parity = len(range(r % 2, p, 2))
    add("split", "allreduce_sum", link_bytes("allreduce_sum", parity, f))

    half = max(p // 2, 1)  # attn_tp = moe_ep = half, moe_tp = p / half, lmhead = p
    for size in (half, half, p // half, p):
        add("plan", "allreduce_sum", link_bytes("allreduce_sum", size, f))
    return exp


def parse(out, tag):
    rows = []
    for line in out.splitlines():
        if line.startswith(tag + " "):
            rows.append(json.loads(line[len(tag) + 1:]))
    return rows


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("n", [1, 2, 4])
def test_collectives_and_counters(comm_check, n):
    rc, out, err, _ = run_job(comm_check, n)
    assert rc == 0, shown(rc, out, err)
    checks = {c["rank"]: c for c in parse(out, "CHECKS")}
    assert sorted(checks) == list(range(n)), shown(rc, out, err)
    for r, c in checks.items():
        assert c["mpi"] == 1, "comm_check was built without MPI (make MPI=0?): rebuild with OpenMPI"
        assert c["failures"] == 0 and c["checks"] > 100, c
    groups = {g["rank"]: g for g in parse(out, "GROUPS")}
    half = max(n // 2, 1)
    for r in range(n):
        assert groups[r] == {"rank": r, "attn_tp": half, "moe_ep": half, "moe_tp": n // half, "lmhead": n}, groups[r]

    got = {}
    for c in parse(out, "COUNTER"):
        assert c["size"] == n
        got.setdefault(c["rank"], {})[(c["phase"], c["kind"])] = (c["calls"], c["sent"], c["recv"])
    for r in range(n):
        assert got.get(r) == expected_counters(r, n), (
            f"rank {r}: counters differ from the comm.h formulas\n got: {got.get(r)}\nwant: {expected_counters(r, n)}")
    # rank 0 prints its table
    assert "comm stats, rank 0 of %d" % n in err and "reduce_scatter_sum" in err, err


def test_rank_abort_ends_the_job(comm_check):
    rc, out, err, secs = run_job(comm_check, 4, {"Q3_COMM_CHECK_ABORT_RANK": "1"})
    assert rc != 0, shown(rc, out, err)
    assert "q3moe: rank 1 of 4: fatal: simulated failure (Q3_COMM_CHECK_ABORT_RANK)" in out + err, shown(rc, out, err)
    assert secs < JOB_TIMEOUT_S
    assert "CHECKS" not in out, shown(rc, out, err)


def test_rank_exit_without_finalize_ends_the_job(comm_check):
    rc, out, err, secs = run_job(comm_check, 2, {"Q3_COMM_CHECK_EXIT_RANK": "1"})
    assert rc != 0, shown(rc, out, err)
    assert "rank 1 exits early" in err, shown(rc, out, err)
    assert "CHECKS" not in out, shown(rc, out, err)


def test_watchdog_aborts_a_stuck_collective(comm_check):
    rc, out, err, secs = run_job(comm_check, 2, {"Q3_COMM_CHECK_STALL_RANK": "1", "Q3MOE_COMM_TIMEOUT": "2"})
    assert rc != 0, shown(rc, out, err)
    text = out + err
    assert "q3moe: rank 0 of 2: fatal: comm timeout: allreduce_sum on group 'world' (phase 'prefill')" in text, \
        shown(rc, out, err)
    assert "Q3MOE_COMM_TIMEOUT=2" in text, shown(rc, out, err)
    assert secs < 30, f"watchdog took {secs:.1f} s for a 2 s timeout"


def test_unwatched_wait_outlasts_the_timeout(comm_check):
    """A wait the caller marks as long (q3_comm_watch(0): the ranks waiting while rank 0 converts
    --quant's cache) goes on past Q3MOE_COMM_TIMEOUT; the collectives after it are watched again."""
    rc, out, err, secs = run_job(comm_check, 2, {"Q3_COMM_CHECK_LONG_WAIT": "3", "Q3MOE_COMM_TIMEOUT": "1"})
    assert rc == 0 and "CHECKS" in out, shown(rc, out, err)
    assert "comm timeout" not in err and secs >= 3, shown(rc, out, err)


def test_bad_timeout_setting_is_refused(comm_check):
    rc, out, err, _ = run_job(comm_check, 1, {"Q3MOE_COMM_TIMEOUT": "soon"})
    assert rc != 0, shown(rc, out, err)
    assert "Q3MOE_COMM_TIMEOUT" in err and "soon" in err, shown(rc, out, err)
