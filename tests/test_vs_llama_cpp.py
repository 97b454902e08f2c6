"""bench/vs_llama_cpp.py refuses bad arguments before it fetches, builds or writes anything.

The comparison itself needs llama.cpp built here (minutes, and the npm registry), so the suite does not
run it; every run checks itself instead: llama.cpp's greedy tokens on the F16 GGUF must be q3moe's on the
checkpoint before anything is timed. What the suite checks is that each bad argument is named on stderr
with exit status 1, that --work stays untouched, that an existing --json file is not overwritten, and
what --avx2 builds llama.cpp with.
"""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q3MOE = os.environ.get("Q3MOE") or os.path.join(ROOT, "build", "q3moe")
SCRIPT = os.path.join(ROOT, "bench", "vs_llama_cpp.py")
PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """Checkpoint directories holding only config.json: nothing may read further before refusing."""
    base = tmp_path_factory.mktemp("vs")
    out = {}
    for name, preset in (("moe", "tiny"), ("dense", "tiny-dense")):
        d = base / name
        subprocess.run([Q3MOE, "synth", "-o", str(d), "--preset", preset, "--dry-run"], check=True,
                       capture_output=True)
        out[name] = d
    return out


def refused(args, tmp_path, message):
    work = tmp_path / "work"
    p = subprocess.run([PYTHON, SCRIPT, "--work", str(work)] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert not work.exists(), "the work folder was made before the arguments were checked"


def test_missing_checkpoint(tmp_path):
    refused(["-m", tmp_path / "nowhere"], tmp_path, f"-m {tmp_path / 'nowhere'}:")


def test_config_not_json(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    refused(["-m", tmp_path / "bad"], tmp_path, f"-m {tmp_path / 'bad'}:")


@pytest.mark.parametrize("args,message", [
    (["-p", "12x"], "-p 12x: expected comma-separated token counts"),
    (["-p", "128,-5"], "-p 128,-5: expected comma-separated token counts"),
    (["-r", "0"], "-r 0: must be at least 1"),
    (["-t", "0"], "-t 0: must be at least 1"),
    (["-n", "-1"], "-n -1: must be at least 0"),
    (["-p", "0", "-n", "0"], "nothing to measure"),
    (["--pairs", "bf16,fp8"], "--pairs: unknown pair 'fp8'"),
    (["--q3moe-opts='--hugepages"], "--q3moe-opts / --llama-opts: No closing quotation"),
    (["--steady", "0.9"], "--steady 0.9: a factor from 1 to 10, or 0 for no read probes"),
    (["--steady", "nan"], "--steady nan: a factor from 1 to 10"),
])
def test_bad_arguments(configs, tmp_path, args, message):
    refused(["-m", configs["moe"]] + args, tmp_path, message)


def test_other_architecture(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    refused(["-m", tmp_path / "llama"], tmp_path, "model_type 'llama' in config.json")


def test_quantized_pair_needs_moe(configs, tmp_path):
    refused(["-m", configs["dense"], "--pairs", "w4a8"], tmp_path, "--pairs w4a8: needs a Qwen3-MoE checkpoint")


def test_checkpoint_without_tokenizer(configs, tmp_path):
    """Refused before the build, not after it, when the F16 GGUF is written."""
    refused(["-m", configs["moe"]], tmp_path, "no tokenizer.json; llama.cpp's GGUF carries the vocabulary")


def test_json_not_overwritten(configs, tmp_path):
    js = tmp_path / "vs.json"
    js.write_text("mine")
    refused(["-m", configs["moe"], "--json", js], tmp_path, f"--json {js} exists (--force overwrites it)")
    assert js.read_text() == "mine"


def load_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("vs_llama_cpp", SCRIPT)
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    return vs


def test_avx2_build(tmp_path):
    """--avx2 builds llama.cpp apart, for AVX2 + FMA without -march=native or AVX-512; the default build
    stays native."""
    vs = load_script()
    for name in ("build", "build-avx2"):
        (tmp_path / name / "bin").mkdir(parents=True)
        for t in vs.TARGETS:
            (tmp_path / name / "bin" / t).write_text("")  # built already: nothing runs
    bins, flags, note = vs.build_llama(str(tmp_path), "unused", False, 1, avx2=True)
    assert bins == str(tmp_path / "build-avx2" / "bin") and "AVX2" in note
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_NATIVE=ON" not in flags
    assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF"} <= set(flags)
    bins, flags, _ = vs.build_llama(str(tmp_path), "unused", False, 1)
    assert bins == str(tmp_path / "build" / "bin") and "-DGGML_NATIVE=ON" in flags
    assert not any("AVX" in f for f in flags)


def test_avx2_refused_without_avx2(configs, tmp_path, monkeypatch, capsys):
    vs = load_script()
    monkeypatch.setattr(vs, "cpu_flags", lambda: {"sse2", "avx"})
    work = tmp_path / "work"
    monkeypatch.setattr("sys.argv", [SCRIPT, "-m", str(configs["moe"]), "--avx2", "--work", str(work)])
    with pytest.raises(SystemExit) as e:
        vs.main()
    assert e.value.code == 1 and "--avx2: this CPU lacks AVX2, FMA or F16C" in capsys.readouterr().err
    assert not work.exists() and os.environ.get("Q3MOE_ISA") != "avx2"


def test_read_probe(tmp_path):
    """The host read probe the rounds take around each engine's run reads a real rate from q3moe bench, and
    a round is steady only when all four of its reads agree within the factor."""
    vs = load_script()
    gbs = vs.read_gbs(Q3MOE, 1, 16)
    assert 0.1 < gbs < 10000
    rnd = lambda lr, qr: {"llama.cpp": {"reads": lr}, "q3moe": {"reads": qr}}  # noqa: E731
    assert vs.is_steady(rnd([35, 36], [34, 37]), 1.15)
    assert not vs.is_steady(rnd([35, 36], [34, 64]), 1.15)
    assert not vs.is_steady(rnd([64, 36], [64, 64]), 1.15)
    assert vs.is_steady(rnd([64, 36], [64, 64]), 2)
    out = vs.probed(lambda: 7.0, lambda: {"decode_ms": 1})
    assert out == {"decode_ms": 1, "reads": [7.0, 7.0]}
