"""Bad input must give a clear error, never a crash or a sanitizer report.

Each test runs the ASan+UBSan binary ($Q3MOE_ASAN) on one corrupted copy of
a small synthetic checkpoint (made once per session with `$Q3MOE synth`) and
checks: non-zero exit that is not a signal, "error" on stderr naming the
file / tensor / config key / argument at fault, and no sanitizer output.
"""
import json
import os
import re
import shutil
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q3MOE = os.environ.get("Q3MOE") or os.path.join(ROOT, "build", "q3moe")
Q3MOE_ASAN = os.environ.get("Q3MOE_ASAN") or os.path.join(ROOT, "build", "asan", "q3moe")
TOKENIZER_DIR = os.path.join(ROOT, "build", "tokenizer")
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
TIMEOUT_S = 300
SIGNAL_CODES = (134, 139)  # abort / segfault as reported through a shell

NORM = "model.norm.weight"
LN0_IN = "model.layers.0.input_layernorm.weight"
LN0_POST = "model.layers.0.post_attention_layernorm.weight"
LN1_POST = "model.layers.1.post_attention_layernorm.weight"
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


# ---------------------------------------------------------------- fixtures

def synth(out_dir, *extra):
    cmd = [Q3MOE, "synth", "-o", str(out_dir), "--preset", "tiny", "--layers", "2", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    assert p.returncode == 0, f"fixture: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}"
    return out_dir


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Single-file checkpoint, vocab 512, no tokenizer."""
    return synth(tmp_path_factory.mktemp("fixtures") / "tiny", "--vocab", "512", "--tokenizer", "none")


@pytest.fixture(scope="session")
def tiny_sharded(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("fixtures") / "sharded", "--vocab", "512",
                 "--tokenizer", "none", "--shard-mb", "1")


@pytest.fixture(scope="session")
def tiny_tok(tmp_path_factory):
    """Full Qwen3 vocabulary with the real tokenizer.json."""
    return synth(tmp_path_factory.mktemp("fixtures") / "tok", "--vocab", "151936",
                 "--tokenizer", TOKENIZER_DIR)


@pytest.fixture
def work(tmp_path_factory):
    """Per-test scratch dir. Unlike tmp_path its name does not contain the
    test's name, which could otherwise supply the very words (e.g.
    "attention_bias") that the error message is required to contain."""
    return tmp_path_factory.mktemp("w")


def corrupt(pristine, work, mutate):
    """Copy a pristine checkpoint and apply mutate(dir) to the copy."""
    d = work / "ckpt"
    shutil.copytree(pristine, d)
    mutate(d)
    return d


# ---------------------------------------------------- safetensors surgery

def read_st(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, body):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)  # the format allows trailing spaces; keeps data aligned
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)


def edit_st(mutate_header, file="model.safetensors"):
    """Mutation that rewrites the header (and body) of one file:
    mutate_header(header, body) -> new body or None to keep it."""
    def mutate(d):
        path = d / file
        header, body = read_st(path)
        new_body = mutate_header(header, body)
        write_st(path, header, body if new_body is None else new_body)
    return mutate


def cut_bytes(header, body, name):
    """Remove a tensor's bytes and header entry, shifting later tensors, so
    the data region stays hole-free. Returns (entry, new body)."""
    entry = header.pop(name)
    b0, b1 = entry["data_offsets"]
    for k, v in header.items():
        if k != "__metadata__" and v["data_offsets"][0] >= b1:
            v["data_offsets"] = [v["data_offsets"][0] - (b1 - b0), v["data_offsets"][1] - (b1 - b0)]
    return entry, body[:b0] + body[b1:]


def nbytes(entry):
    return entry["data_offsets"][1] - entry["data_offsets"][0]


# ------------------------------------------------------------- checking

def run_q3(args):
    env = dict(os.environ)
    env.update(SAN_ENV)
    cmd = [os.fsencode(Q3MOE_ASAN)] + [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    p = subprocess.run(cmd, capture_output=True, env=env, timeout=TIMEOUT_S)
    return p.returncode, p.stderr.decode("utf-8", "replace"), p.stdout.decode("utf-8", "replace")


def expect_error(args, must=(), any_of=(), exit_code=None):
    """Run q3moe (ASan build) and check for a clean, named failure. Every
    string in `must` and at least one of `any_of` must be in stderr.
    Returns stderr."""
    rc, err, out = run_q3(args)
    shown = f"command: q3moe {' '.join(map(str, args))}\nexit: {rc}\nstderr:\n{err}\nstdout:\n{out[:2000]}"
    assert "Sanitizer" not in err and "runtime error:" not in err, "sanitizer report\n" + shown
    assert rc != 0, "expected failure, got exit 0\n" + shown
    assert rc > 0 and rc not in SIGNAL_CODES, "crashed (signal)\n" + shown
    if exit_code is not None:
        assert rc == exit_code, f"expected exit {exit_code}\n" + shown
    assert "error" in err.lower(), "no 'error' on stderr\n" + shown
    for s in must:
        assert s in err, f"stderr does not name {s!r}\n" + shown
    if any_of:
        assert any(s in err for s in any_of), f"stderr names none of {list(any_of)}\n" + shown
    return err


def logits_args(d, work, ids="1,2,3", *extra):
    return ["logits", "-m", d, "--ids", ids, "-o", work / "out.bin", *extra]


def without_paths(text, *paths):
    """stderr with tmp paths blanked, so digits in them cannot match."""
    for p in paths:
        text = text.replace(str(p), "<path>")
    return re.sub(r"/tmp/\S*", "<path>", text)


# ------------------------------------------------- controls: valid input

def test_pristine_checkpoint_loads(tiny, work):
    rc, err, _ = run_q3(logits_args(tiny, work))
    assert rc == 0 and "Sanitizer" not in err and "runtime error:" not in err, err


def test_pristine_sharded_checkpoint_loads(tiny_sharded, work):
    assert (tiny_sharded / "model.safetensors.index.json").is_file()
    rc, err, _ = run_q3(logits_args(tiny_sharded, work))
    assert rc == 0 and "Sanitizer" not in err and "runtime error:" not in err, err


# ------------------------------------------------------- safetensors file

def test_truncated_safetensors(tiny, work):
    def mutate(d):
        path = d / "model.safetensors"
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        path.write_bytes(raw[:8 + n + (len(raw) - 8 - n) // 2])
    d = corrupt(tiny, work, mutate)
    expect_error(logits_args(d, work), must=["model.safetensors"])


@pytest.mark.parametrize("how", ["just_past_end", "huge"])
def test_header_length_past_end(tiny, work, how):
    def mutate(d):
        path = d / "model.safetensors"
        raw = path.read_bytes()
        n = len(raw) - 8 + 1 if how == "just_past_end" else 2**64 - 16  # the latter wraps 8 + n
        path.write_bytes(struct.pack("<Q", n) + raw[8:])
    d = corrupt(tiny, work, mutate)
    expect_error(logits_args(d, work), must=["model.safetensors"])


def test_header_not_json(tiny, work):
    def mutate(d):
        path = d / "model.safetensors"
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        path.write_bytes(raw[:8] + b"{" + b"x" * (n - 1) + raw[8 + n:])
    d = corrupt(tiny, work, mutate)
    expect_error(logits_args(d, work), must=["model.safetensors"])


def test_data_offsets_outside_data(tiny, work):
    def mut(header, body):
        size = nbytes(header[NORM])
        header[NORM]["data_offsets"] = [len(body) + 64, len(body) + 64 + size]
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), must=[NORM])


def test_data_offsets_overlap(tiny, work):
    # Two same-size tensors share one range; the other's bytes are cut so
    # that the only defect is the overlap (no hole).
    def mut(header, body):
        entry, body = cut_bytes(header, body, LN0_POST)
        assert nbytes(entry) == nbytes(header[LN0_IN])
        entry["data_offsets"] = list(header[LN0_IN]["data_offsets"])
        header[LN0_POST] = entry
        return body
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), any_of=[LN0_IN, LN0_POST])


def test_size_not_matching_shape(tiny, work):
    def mut(header, body):
        header[NORM]["shape"] = [header[NORM]["shape"][0] + 1]
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), must=[NORM])


def test_shape_wrong_for_config(tiny, work):
    # Same element count (so the file itself is consistent), wrong geometry.
    def mut(header, body):
        rows, cols = header[Q_PROJ]["shape"]
        header[Q_PROJ]["shape"] = [cols, rows] if rows != cols else [rows * 2, cols // 2]
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), must=[Q_PROJ])


def test_unsupported_dtype(tiny, work):
    # I8 with a shape whose size matches the bytes, so only the dtype is wrong.
    def mut(header, body):
        header[NORM]["dtype"] = "I8"
        header[NORM]["shape"] = [nbytes(header[NORM])]
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), any_of=[NORM, "I8"])


def test_missing_tensor(tiny, work):
    def mut(header, body):
        _, body = cut_bytes(header, body, LN1_POST)
        return body
    d = corrupt(tiny, work, edit_st(mut))
    expect_error(logits_args(d, work), must=[LN1_POST])


# ------------------------------------------------------------- config.json

def edit_config(mutate_cfg):
    def mutate(d):
        path = d / "config.json"
        cfg = json.loads(path.read_text())
        mutate_cfg(cfg)
        path.write_text(json.dumps(cfg, indent=2))
    return mutate


def non_divisor_kv_heads(cfg):
    heads = cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = next((k for k in range(2, heads) if heads % k), heads + 1)


CONFIG_CASES = {
    "missing_hidden_size": (lambda c: c.pop("hidden_size"), ["hidden_size"]),
    "kv_heads_not_dividing": (non_divisor_kv_heads, ["num_key_value_heads"]),
    "experts_per_tok_too_big": (lambda c: c.update(num_experts_per_tok=c["num_experts"] + 1),
                                ["num_experts_per_tok"]),
    "zero_layers": (lambda c: c.update(num_hidden_layers=0), ["num_hidden_layers"]),
    "string_for_number": (lambda c: c.update(hidden_size=str(c["hidden_size"])), ["hidden_size"]),
    "attention_bias": (lambda c: c.update(attention_bias=True), ["attention_bias"]),
    "sliding_window": (lambda c: c.update(use_sliding_window=True), ["use_sliding_window"]),
    "rope_scaling": (lambda c: c.update(rope_scaling={"type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32768}),
                     ["rope_scaling"]),
    "eos_string": (lambda c: c.update(eos_token_id="2"), ["eos_token_id"]),
    "eos_list_bad_entry": (lambda c: c.update(eos_token_id=[1, "x"]), ["eos_token_id"]),
    "eos_empty_list": (lambda c: c.update(eos_token_id=[]), ["eos_token_id"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config(tiny, work, case):
    mutate_cfg, names = CONFIG_CASES[case]
    d = corrupt(tiny, work, edit_config(mutate_cfg))
    expect_error(logits_args(d, work), must=names)


def test_eos_past_the_vocabulary_is_ignored(tiny, work):
    # such an id can never be sampled (older synth wrote Qwen3's into small vocabularies): a note, no error
    d = corrupt(tiny, work, edit_config(lambda c: c.update(eos_token_id=c["vocab_size"])))
    rc, err, _ = run_q3(logits_args(d, work))
    assert rc == 0 and "eos_token_id" in err and "ignored" in err, err


def test_config_not_json(tiny, work):
    d = corrupt(tiny, work, lambda d: (d / "config.json").write_text('{"hidden_size": 64,,'))
    expect_error(logits_args(d, work), must=["config.json"])


def test_config_missing(tiny, work):
    d = corrupt(tiny, work, lambda d: (d / "config.json").unlink())
    expect_error(logits_args(d, work), must=["config.json"])


# ------------------------------------------------------------- sharded sets

def shard_names(d):
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


def test_index_names_missing_shard(tiny_sharded, work):
    missing = "model-00099-of-00099.safetensors"

    def mutate(d):
        path = d / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        index["weight_map"][NORM] = missing
        path.write_text(json.dumps(index, indent=2))
    d = corrupt(tiny_sharded, work, mutate)
    expect_error(logits_args(d, work), must=[missing])


def test_deleted_shard(tiny_sharded, work):
    victim = shard_names(tiny_sharded)[-1]
    d = corrupt(tiny_sharded, work, lambda d: (d / victim).unlink())
    expect_error(logits_args(d, work), must=[victim])


# ------------------------------------------------------------ run requests

def test_token_id_out_of_range(tiny, work):
    err = expect_error(logits_args(tiny, work, "1,2,99999"))
    text = without_paths(err, tiny, work)
    assert re.search(r"\b99999\b", text), f"id not named:\n{err}"
    assert re.search(r"\b512\b", text), f"vocab size not named:\n{err}"


def test_prompt_longer_than_context(tiny, work):
    ids = ",".join(str(i + 1) for i in range(20))
    err = expect_error(logits_args(tiny, work, ids, "--ctx", "8"))
    text = without_paths(err, tiny, work)
    assert re.search(r"\b8\b", text), f"context size not mentioned:\n{err}"
    assert re.search(r"context|ctx", text, re.I), f"context not mentioned:\n{err}"


def test_empty_dir_is_not_a_checkpoint(work):
    d = work / "empty"
    d.mkdir()
    expect_error(logits_args(d, work), any_of=[str(d), "config.json"])


def test_regular_file_is_not_a_checkpoint(work):
    f = work / "model.bin"
    f.write_bytes(b"\0" * 1024)
    expect_error(logits_args(f, work), any_of=[str(f), "director"])


# ------------------------------------------------- non-finite weights

def set_bf16(name, value, at=None):
    """Mutation: element at = (row, col) of a 2-D BF16 tensor (every element
    when None) set to the 16-bit pattern `value`."""
    def mutate(header, body):
        b0, b1 = header[name]["data_offsets"]
        body = bytearray(body)
        if at is None:
            body[b0:b1] = struct.pack("<H", value) * ((b1 - b0) // 2)
        else:
            struct.pack_into("<H", body, b0 + 2 * (at[0] * header[name]["shape"][1] + at[1]), value)
        return bytes(body)
    return edit_st(mutate)


NAN_RUNS = {
    "greedy": lambda d, w: ["generate", "-m", d, "--ids", "1,2,3", "-n", "4", "--temp", "0"],
    "sampled": lambda d, w: ["generate", "-m", d, "--ids", "1,2,3", "-n", "4", "--seed", "1"],
    "top_p": lambda d, w: ["generate", "-m", d, "--ids", "1,2,3", "-n", "4", "--top-k", "0", "--seed", "1"],
    "perplexity": lambda d, w: ["perplexity", "-m", d, "--ids", "1,2,3,4,5"],
}


@pytest.mark.parametrize("value,word", [(0x7FC0, "NaN"), (0xFF80, "-infinity")])
@pytest.mark.parametrize("how", sorted(NAN_RUNS))
def test_non_finite_weight_named(tiny, work, how, value, word):
    """Weights are not checked at load; NaN logits must stop the run and
    name the tensor, never print made-up tokens."""
    d = corrupt(tiny, work, set_bf16(Q_PROJ, value, (2, 70)))
    err = expect_error(NAN_RUNS[how](d, work), exit_code=1)
    assert f"tensor {Q_PROJ} in {d / 'model.safetensors'} holds {word} at [2, 70]" in err, err


def test_bench_warns_of_nan_logits(tiny, work):
    """bench's timings stand on a NaN model, but it says the output is NaN."""
    d = corrupt(tiny, work, set_bf16(Q_PROJ, 0x7FC0, (1, 1)))
    args = ["bench", "-m", d, "-p", "8", "-n", "2", "-r", "1", "--no-ttft", "--no-membw"]
    rc, err, out = run_q3(args)
    assert rc == 0 and "Sanitizer" not in err and "runtime error:" not in err, err
    assert "every logit of the prefill is NaN" in err, err
    rc, err, out = run_q3(["bench", "-m", tiny, *args[3:]])
    assert rc == 0 and "NaN" not in err, err


def test_non_finite_weight_of_base_named(tiny, work):
    d = corrupt(tiny, work, set_bf16(Q_PROJ, 0x7F80, (0, 5)))
    err = expect_error(["perplexity", "-m", tiny, "--base", d, "--ids", "1,2,3,4"], exit_code=1)
    assert f"tensor {Q_PROJ} in {d / 'model.safetensors'} holds +infinity at [0, 5]" in err, err


def test_activation_overflow_named(tiny, work):
    # every element the largest finite bf16: the residual overflows to inf,
    # and the next RMSNorm turns it into NaN
    d = corrupt(tiny, work, set_bf16("model.layers.0.self_attn.o_proj.weight", 0x7F7F))
    err = expect_error(NAN_RUNS["greedy"](d, work), must=["activation overflowed"], exit_code=1)
    assert "holds" not in err


def test_non_finite_weight_in_q3m_named(tiny, work):
    """convert keeps BF16 tensors as they are; the .q3m is scanned too."""
    d = corrupt(tiny, work, set_bf16(Q_PROJ, 0x7FC0, (0, 9)))
    out = work / "m.q3m"
    p = subprocess.run([Q3MOE, "convert", "-m", d, "-o", out, "--attn", "bf16", "-q"], capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr
    err = expect_error(NAN_RUNS["greedy"](out, work), exit_code=1)
    assert f"tensor {Q_PROJ} in {out} holds NaN at [0, 9]" in err, err


# ----------------------------------------------------------------- prompts

def test_invalid_utf8_prompt(tiny_tok):
    err = expect_error(["generate", "-m", tiny_tok, "-n", "1", "-p", b"\xff\xfe"])
    assert re.search(r"utf-?8", err, re.I), f"UTF-8 not mentioned:\n{err}"


def test_text_prompt_without_tokenizer(tiny):
    expect_error(["generate", "-m", tiny, "-n", "1", "-p", "hello"], must=["tokenizer.json"])


def test_empty_tokenizer_json(tiny, work):
    # Found by `make fuzz-run` (tokenizer_json): an empty file maps to no
    # memory, and the scanner did arithmetic on the NULL pointer.
    d = corrupt(tiny, work, lambda d: (d / "tokenizer.json").write_bytes(b""))
    err = expect_error(["generate", "-m", d, "-n", "1", "-p", "hello"], must=["tokenizer.json"])
    assert "empty" in err, f"empty file not named:\n{err}"


# ------------------------------------------------------------ command line

@pytest.mark.parametrize("args,names", [
    (["--bogus"], ["--bogus"]),
    (["-n", "-5"], ["-n"]),
    (["--temp", "abc"], ["--temp", "abc"]),
])
def test_bad_cli_args(tiny, args, names):
    expect_error(["generate", "-m", tiny, "-p", "hi", *args], must=names, exit_code=2)


@pytest.mark.parametrize("args,names", [
    (["-p", "hi", "--no-think"], ["--no-think", "--chat"]),
    (["-p", "hi", "--system", "be brief"], ["--system", "--chat"]),
    (["--ids", "1,2", "--print-ids", "--stop", "x"], ["--stop", "--print-ids"]),
    (["-p", "hi", "--stop", ""], ["--stop", "empty"]),
    (["--ids", "1,2,"], ["--ids"]),
    (["--ids", "1, ,2"], ["--ids"]),
    (["--ids", "1,2, "], ["--ids"]),
])
def test_options_that_would_be_ignored(tiny, args, names):
    expect_error(["generate", "-m", tiny, *args], must=names, exit_code=2)


def test_ids_without_tokenizer_print_ids(tiny):
    # no tokenizer.json: the generated ids are the only output there is
    rc, err, out = run_q3(["generate", "-m", tiny, "--ids", " 1, 2 ", "-n", "3", "--temp", "0"])
    assert rc == 0, err
    ids = json.loads(out)
    assert len(ids) == 3 and all(isinstance(i, int) for i in ids), out
    assert "no tokenizer.json" in err, err
    expect_error(["generate", "-m", tiny, "--ids", "1", "-n", "2", "--stop", "x"], must=["--stop", "tokenizer.json"])


def test_prompt_file_keeps_nul_bytes(tiny_tok, work):
    # the tokenizer gets the whole file, as `tokenize -f` does; the chat template cannot take NUL
    f = work / "nul.txt"
    f.write_bytes(b"hello\0world")
    rc, err, _ = run_q3(["generate", "-m", tiny_tok, "-f", f, "-n", "1", "--temp", "0"])
    _, _, toks = run_q3(["tokenize", "-m", tiny_tok, "-f", f])
    assert rc == 0, err
    assert f"prompt tokens: {len(json.loads(toks))}," in err and len(json.loads(toks)) > 1, (err, toks)
    expect_error(["generate", "-m", tiny_tok, "-f", f, "--chat", "-n", "1"], must=["nul.txt", "byte 5", "NUL"])


def test_prompt_file_is_a_directory(tiny, work):
    expect_error(["generate", "-m", tiny, "-f", work, "-n", "1"], must=[str(work), "Is a directory"])


@pytest.mark.parametrize("cmd", ["bench", "perplexity", "logits", "plan", "convert"])
def test_output_path_checked_before_the_work(tiny, work, cmd):
    # a missing directory or a directory as the output fails at once, before any loading
    text = work / "t.txt"
    text.write_text("one two three four five six seven eight")
    base = {"bench": ["bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "--no-ttft", "--no-membw", "--json"],
            "perplexity": ["perplexity", "-m", tiny, "--ids", "1,2,3,4", "--json"],
            "logits": ["logits", "-m", tiny, "--ids", "1,2", "-o"],
            "plan": ["plan", "-m", tiny, "--ranks", "1", "--json"],
            "convert": ["convert", "-m", tiny, "-o"]}[cmd]
    missing = work / "no-such-dir" / "out.json"
    err = expect_error(base + [missing], must=[str(missing), "No such file or directory"])
    assert "[bench] loading" not in err and "prefill" not in err, err
    expect_error(base + [work, "--force"], must=[str(work), "is a directory"])
    assert not (work / "no-such-dir").exists()


@pytest.mark.parametrize("cmd", [["synth", "--preset", "tiny", "--dry-run"], ["convert", "-m", "."]])
def test_empty_output_path(cmd):
    # an empty -o once sent synth's mkdir -p one byte past its copy of the path
    expect_error([*cmd, "-o", ""], must=["-o", "empty"])


def _small_files():
    # writes past 64 KiB fail with EFBIG (SIGXFSZ ignored), as on a full disk
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))


@pytest.mark.parametrize("cmd", ["logits", "bench"])
def test_failed_write_leaves_no_partial_file(tiny, work, cmd):
    out = work / "out"
    args = (["logits", "-m", tiny, "--ids", ",".join(["1"] * 100), "-o", out] if cmd == "logits" else
            ["bench", "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "--no-ttft", "--no-membw", "--json", out])
    env = dict(os.environ)
    env.update(SAN_ENV)
    p = subprocess.run([Q3MOE] + [str(a) for a in args], capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
                       preexec_fn=_small_files if cmd == "logits" else None)
    if cmd == "bench":  # the JSON is small: make its write fail another way, a full device behind a link
        assert p.returncode == 0, p.stderr
        out.unlink()
        out.symlink_to("/dev/full")
        p = subprocess.run([Q3MOE] + [str(a) for a in args] + ["--force"], capture_output=True, text=True, env=env,
                           timeout=TIMEOUT_S)
        assert p.returncode == 1 and "--json" in p.stderr and str(out) in p.stderr, p.stderr
        assert os.path.exists("/dev/full") and out.is_symlink()  # the device is no partial file
        return
    assert p.returncode == 1 and "error writing" in p.stderr and str(out) in p.stderr, p.stderr
    assert not out.exists(), "a partial logits file was left behind"


def test_output_that_cannot_be_written_fails(tiny):
    # stdout on a full device: the tokens never arrived, so the run failed
    with open("/dev/full", "w") as full:
        p = subprocess.run([Q3MOE, "generate", "-m", tiny, "--ids", "1,2", "-n", "2", "--temp", "0"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S)
    assert p.returncode == 1 and "writing the output failed" in p.stderr, p.stderr


def test_convert_refuses_to_overwrite_its_input(tiny, work):
    d = work / "ck"
    shutil.copytree(tiny, d)
    before = (d / "model.safetensors").read_bytes()
    for name in ["model.safetensors", "config.json"]:
        expect_error(["convert", "-m", d, "-o", d / name, "--force"], must=[name, "checkpoint"])
    assert (d / "model.safetensors").read_bytes() == before
