"""Running q3moe under mpirun from the tests: the environment OpenMPI needs
here (root in a container, ranks that yield on an oversubscribed machine) and
a runner that kills the whole process group if a job hangs."""
import os
import signal
import subprocess

import pytest

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_mpi_yield_when_idle": "1"}


def run(cmd, timeout=120):
    """(stdout, stderr) of cmd, which must exit 0 within timeout seconds."""
    env = dict(os.environ)
    env.update(MPI_ENV)
    p = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"{cmd} hung")
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{err[-4000:]}"
    return out, err
