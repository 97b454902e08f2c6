"""The fuzz targets (tests/fuzz/) replayed in the ASan+UBSan build.

`make fuzz-run` fuzzes the loaders of user files with libFuzzer (clang);
here each target's replay binary (tests/fuzz/replay.c, built by `make
asan`) runs its seed corpus, which q3moe itself makes (tests/fuzz/seeds.sh),
any inputs committed under tests/fuzz/corpus/TARGET (findings of past
fuzzing runs, once fixed; none so far), and a fixed set of mutants of each.
Every input must be loaded or refused with a message: no crash, no
sanitizer report, no hang.
"""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q3MOE = os.environ.get("Q3MOE") or os.path.join(ROOT, "build", "q3moe")
REPLAY_DIR = os.path.join(ROOT, "build", "asan", "fuzz")
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
TARGETS = ("q3m", "safetensors", "convert", "config", "plan", "tokenize", "tokenizer_json")
# Mutants per seed file (tokenize has 300 seeds, the others 1-3).
MUTATIONS = {"q3m": 400, "safetensors": 400, "convert": 150, "config": 1000, "plan": 1000, "tokenize": 30, "tokenizer_json": 500}
TOKENIZER = os.path.join(ROOT, "build", "tokenizer", "tokenizer.json")
TIMEOUT_S = 300


@pytest.fixture(scope="session")
def seeds(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "seeds"
    p = subprocess.run(["bash", os.path.join(ROOT, "tests", "fuzz", "seeds.sh"), str(out)],
                       env={**os.environ, "Q3MOE": Q3MOE}, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert p.returncode == 0, f"tests/fuzz/seeds.sh failed:\n{p.stderr}"
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_replay(target, seeds, tmp_path):
    binary = os.path.join(REPLAY_DIR, f"replay_{target}")
    assert os.access(binary, os.X_OK), f"{binary} missing: run `make asan`"
    inputs = [str(seeds / target)]
    committed = os.path.join(ROOT, "tests", "fuzz", "corpus", target)
    if os.path.isdir(committed):
        inputs.append(committed)
    p = subprocess.run([binary, "--mutations", str(MUTATIONS[target]), *inputs], cwd=tmp_path,
                       env={**os.environ, **SAN_ENV, "Q3_FUZZ_TOKENIZER": TOKENIZER}, capture_output=True, text=True, errors="replace",
                       timeout=TIMEOUT_S)
    report = p.stdout + p.stderr
    crash = tmp_path / "replay-crash.bin"
    assert p.returncode == 0 and "Sanitizer" not in report and "runtime error:" not in report, (
        f"replay_{target} failed ({p.returncode}); the input is {crash if crash.exists() else 'lost'}:\n"
        + report[-6000:])
    assert "none crashed" in p.stdout
