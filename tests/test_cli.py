"""The command-line contract of README.md "Commands": help and exit codes,
`generate` (stats line, chat wrapping, sampling determinism, -n, streaming
UTF-8, --stop, context limits) and `chat` (KV cache kept between turns,
/reset, /think switches, end of input).

Two checkpoints, made once per session with `$Q3MOE synth --preset tiny
--layers 2` and the real Qwen3 tokenizer (vocab 151936):

- `model`: random weights. Its output is gibberish, but that is what is
  needed to compare one command against another (a run's text against
  `tokenize --decode` of the ids of the same run, a chat turn against
  `generate --ids` of the whole conversation, ...).
- `scripted`: the same, edited so that greedy decoding follows a fixed chain
  of tokens (see `scripted`), which splits characters across tokens in every
  way the streaming decoder has to handle and gives exact texts for --stop.

Every run uses one thread (`-t 1`): the suite runs next to benchmarks.
"""
import functools
import json
import os
import re
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q3MOE = os.environ.get("Q3MOE") or os.path.join(ROOT, "build", "q3moe")
TOKENIZER_DIR = os.path.join(ROOT, "build", "tokenizer")
TIMEOUT_S = 120
T1 = ["-t", "1"]
COMMANDS = ["generate", "chat", "tokenize", "logits", "synth", "convert", "perplexity", "bench", "plan"]
IM_END = "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
FFFD = "\ufffd".encode()

STATS = re.compile(r"\[q3moe\] prompt tokens: (\d+), prefill: (\d+\.\d) ms \((\d+\.\d) tok/s\), "
                   r"generated tokens: (\d+), (\d+\.\d\d) ms/token \((\d+\.\d) tok/s\)(.*)")
CTX_FULL = " [stopped: context full]"


# ------------------------------------------------------------------ helpers

def run(args, stdin=b""):
    cmd = [os.fsencode(Q3MOE)] + [a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=TIMEOUT_S)


def shown(p):
    return (f"command: {b' '.join(p.args).decode(errors='replace')}\nexit: {p.returncode}\n"
            f"stderr:\n{p.stderr.decode(errors='replace')}\nstdout:\n{p.stdout[:2000]!r}")


def ok(args, stdin=b""):
    p = run(args, stdin)
    assert p.returncode == 0, shown(p)
    return p


def stats_lines(p):
    """Every stats line on stderr, as dicts."""
    out = []
    for line in p.stderr.decode().splitlines():
        m = STATS.fullmatch(line)
        if m:
            out.append({"prompt": int(m[1]), "prefill_ms": float(m[2]), "generated": int(m[4]),
                        "ms_per_token": float(m[5]), "note": m[7]})
    return out


def final_stats(p):
    """generate ends with the stats line: it must be the last line of stderr."""
    lines = p.stderr.decode().rstrip("\n").split("\n")
    assert STATS.fullmatch(lines[-1]), "last stderr line is not the stats line\n" + shown(p)
    return stats_lines(p)[-1]


def generate(model, *args):
    """(stdout bytes, stats) of a successful `generate`."""
    p = ok(["generate", "-m", model, *T1, *args])
    return p.stdout, final_stats(p)


def generate_ids(model, *args):
    """(printed ids, stats) of a successful `generate --print-ids`."""
    out, st = generate(model, *args, "--print-ids")
    assert out.endswith(b"]\n"), out
    return json.loads(out), st


@functools.lru_cache(maxsize=None)
def _tokenize(model, text):
    return tuple(json.loads(ok(["tokenize", "-m", model, "-p", text]).stdout))


def tokenize(model, text):
    return list(_tokenize(str(model), text))


def decode(model, ids):
    return ok(["tokenize", "-m", model, "--decode", "--ids", ",".join(map(str, ids))]).stdout


def chat_turn(user, system=None, think=True):
    """One user turn of the Qwen3 chat template, ending with the assistant header."""
    s = f"<|im_start|>system\n{system}{IM_END}\n" if system is not None else ""
    s += f"<|im_start|>user\n{user}{IM_END}\n<|im_start|>assistant\n"
    return s + ("" if think else EMPTY_THINK)


def byte_decoder():
    """GPT-2 byte-level alphabet -> byte (inverse of bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


# ----------------------------------------------------------------- fixtures

def synth(out_dir):
    ok(["synth", "-o", out_dir, "--preset", "tiny", "--layers", "2", "--dtype", "bf16",
        "--tokenizer", TOKENIZER_DIR])
    return out_dir


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    if not os.access(Q3MOE, os.X_OK):
        pytest.fail(f"no q3moe binary at {Q3MOE} (run make, or set Q3MOE)")
    return synth(tmp_path_factory.mktemp("cli") / "random")


@pytest.fixture(scope="session")
def token_bytes():
    """id -> raw bytes, for every id tokenizer.json knows, read here in Python."""
    with open(os.path.join(TOKENIZER_DIR, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    dec = byte_decoder()
    tb = {i: bytes(dec[c] for c in s) for s, i in t["model"]["vocab"].items()}
    for a in t["added_tokens"]:
        tb[a["id"]] = a["content"].encode()
    return tb


def lossy(token_bytes, ids):
    """What the streamed text must be: the bytes of the ids the tokenizer knows
    (the model's vocab is larger: other ids print nothing), invalid or
    truncated UTF-8 replaced by U+FFFD as Python (and HF decode) do."""
    return b"".join(token_bytes[i] for i in ids if i in token_bytes).decode("utf-8", "replace").encode()


# The scripted model's greedy continuation of "Hello": each entry is one
# token's raw bytes. Characters are split across tokens (你 = e4 bd|a0,
# 🙂 = ' ' f0 9f|99 82, 好 = ' ' e5|a5|bd), a lead byte is followed by
# ASCII (e4|'!': one U+FFFD, then '!'), a lone continuation byte (80), a NUL
# byte, and the text ends inside a character (f0|9f) before <|im_end|>.
CHAIN = [b" world", b"\xe4\xbd", b"\xa0", b" \xf0\x9f", b"\x99\x82", b" \xe5", b"\xa5", b"\xbd",
         b"\xe4", b"!", b"\x80", b"\x00", b" done", b"\xf0", b"\x9f"]
CHAIN_TEXT = " world你 🙂 好\ufffd!\ufffd\x00 done\ufffd".encode()


def script(d, seq):
    """Makes checkpoint d's greedy next token after seq[k] be seq[k + 1].

    Every o_proj and expert down_proj is zeroed, so the residual stream is
    just the current token's embedding and the next-token logits depend on
    the current token only. Token k of seq gets the one-hot embedding e_k;
    the final norm weight is 1, and lm_head[seq[k + 1]][k] = 8, so seq[k + 1]
    scores 8 * 16 = 128 against a few units at most for every other token."""
    assert len(set(seq)) == len(seq), "a token repeats: the chain would not be a function"
    path = d / "model.safetensors"
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        hidden = header["model.norm.weight"]["shape"][0]

        def bf16(x):  # exact for the values used here: the high half of the float32
            return struct.pack("<f", x)[2:]

        def put(name, offset_elems, data):
            e = header[name]
            assert e["dtype"] == "BF16", e
            f.seek(base + e["data_offsets"][0] + 2 * offset_elems)
            f.write(data)

        for name, e in header.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                put(name, 0, bytes(e["data_offsets"][1] - e["data_offsets"][0]))
        put("model.norm.weight", 0, bf16(1.0) * hidden)
        for k, (tok, nxt) in enumerate(zip(seq, seq[1:])):
            put("model.embed_tokens.weight", tok * hidden, b"".join(bf16(float(j == k)) for j in range(hidden)))
            put("lm_head.weight", nxt * hidden + k, bf16(8.0))


@pytest.fixture(scope="session")
def scripted(tmp_path_factory, token_bytes):
    """A checkpoint whose greedy continuation of "Hello" is CHAIN then <|im_end|>.
    Returns (dir, chain ids without the prompt, <|im_end|> id)."""
    d = synth(tmp_path_factory.mktemp("cli") / "scripted")
    ids_of = {b: i for i, b in sorted(token_bytes.items(), reverse=True)}  # lowest id wins
    start = tokenize(d, "Hello")
    assert len(start) == 1
    chain = [ids_of[b] for b in CHAIN]
    eos = ids_of[IM_END.encode()]
    script(d, start + chain + [eos])
    return d, chain, eos


@pytest.fixture(scope="session")
def reasoning(tmp_path_factory):
    """A checkpoint that answers every chat turn with THOUGHT_ANSWER (after
    the assistant header's "\n": reasoning, </think>, then the answer) or,
    after the empty think block of a turn without thinking, with ANSWER."""
    d = synth(tmp_path_factory.mktemp("cli") / "reasoning")
    seq = tokenize(d, "\n" + THOUGHT_ANSWER) + tokenize(d, IM_END)
    assert seq[1] == tokenize(d, "<think>")[0] and len(tokenize(d, "<think>")) == 1
    script(d, seq)
    return d


# " \n" after the header's "\n" is one token in the template's rendering ("\n \n"), two as generated
THOUGHT_ANSWER = "<think>Hm</think>\n\n \nSure"
ANSWER = " \nSure"


# --------------------------------------------------------- help, exit codes

def test_top_level_help_lists_the_commands():
    p = ok(["--help"])
    out = p.stdout.decode()
    assert "usage: q3moe COMMAND" in out
    listed = re.findall(r"^  (\S+) ", out.split("commands:", 1)[1], flags=re.M)
    assert listed == COMMANDS, out


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("cmd", COMMANDS)
def test_command_help(cmd, flag):
    p = ok([cmd, flag])
    assert f"usage: q3moe {cmd}" in p.stdout.decode(), shown(p)


def test_no_arguments_exits_2_with_usage():
    p = run([])
    assert p.returncode == 2, shown(p)
    assert "usage: q3moe COMMAND" in p.stderr.decode() and p.stdout == b"", shown(p)


def test_unknown_command_exits_2():
    p = run(["frobnicate", "-m", "x"])
    assert p.returncode == 2, shown(p)
    err = p.stderr.decode()
    assert "unknown command 'frobnicate'" in err and "usage: q3moe COMMAND" in err, shown(p)


# ------------------------------------------------- generate: the stats line

@pytest.mark.parametrize("prompt", [
    "Hello world",
    "Grüße, 你好, 🙂 — and some   spaces\n\tand lines",
    "<|im_start|>user\nspecial tokens in plain text<|im_end|>\n",
])
def test_generate_stats_line_plain_prompt(model, prompt):
    out, st = generate(model, "-p", prompt, "-n", "3", "--seed", "1")
    assert st["prompt"] == len(tokenize(model, prompt))
    assert 1 <= st["generated"] <= 3 and st["note"] == ""
    assert st["prefill_ms"] > 0 and st["ms_per_token"] >= 0


@pytest.mark.parametrize("args, text", [
    (["-p", "hi there"], chat_turn("hi there")),
    (["-p", "hi there", "--no-think"], chat_turn("hi there", think=False)),
    (["-p", "hi there", "--system", "You are terse."], chat_turn("hi there", "You are terse.")),
    (["-p", "hi", "--system", "S", "--no-think"], chat_turn("hi", "S", think=False)),
    (["-p", "hi /no_think there"], chat_turn("hi /no_think there", think=False)),
    # switches are words of their own: not inside </think>, a path or a longer word
    (["-p", "What does </think> mean?", "--no-think"], chat_turn("What does </think> mean?", think=False)),
    (["-p", "see a.com/think/x or /thinking", "--no-think"], chat_turn("see a.com/think/x or /thinking", think=False)),
    (["-p", "hi/no_think"], chat_turn("hi/no_think")),
    (["-p", "why? /think.", "--no-think"], chat_turn("why? /think.")),
    (["-p", "你好/no_think"], chat_turn("你好/no_think", think=False)),  # text written without spaces
    (["-p", "(/no_think)"], chat_turn("(/no_think)", think=False)),
], ids=["think", "no-think", "system", "system-no-think", "slash-no_think", "end-tag-not-a-switch",
        "path-not-a-switch", "glued-not-a-switch", "slash-think-punctuated", "after-cjk", "in-parentheses"])
def test_generate_chat_prompt_tokens(model, args, text):
    _, st = generate(model, "--chat", *args, "-n", "1", "--seed", "1")
    assert st["prompt"] == len(tokenize(model, text))


def test_generate_mlock(model):
    """--mlock gives the same greedy text, or (where the locked-memory limit forbids it) a clear
    error naming the option and the file, never a crash."""
    p = run(["generate", "-m", model, *T1, "-p", "hi there", "-n", "4", "--temp", "0", "--mlock"])
    if p.returncode == 0:
        assert p.stdout == generate(model, "-p", "hi there", "-n", "4", "--temp", "0")[0]
    else:
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and "--mlock" in err and "ulimit -l" in err, shown(p)


def test_generate_hugepages(model):
    """--hugepages reads the weights into an anonymous copy instead of mapping them: the same
    greedy text, and the same with --mlock on top (or --mlock's clear error)."""
    want = generate(model, "-p", "hi there", "-n", "6", "--temp", "0")[0]
    assert generate(model, "-p", "hi there", "-n", "6", "--temp", "0", "--hugepages")[0] == want
    p = run(["generate", "-m", model, *T1, "-p", "hi there", "-n", "6", "--temp", "0", "--hugepages", "--mlock"])
    if p.returncode == 0:
        assert p.stdout == want
    else:
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and "--mlock" in err and "ulimit -l" in err, shown(p)


def test_generate_chat_wraps_the_prompt(model):
    """--chat gives exactly the continuation of the wrapped prompt."""
    text = chat_turn("hi there", "S", think=False)
    a = generate(model, "--chat", "--system", "S", "--no-think", "-p", "hi there", "-n", "6", "--temp", "0")
    b = generate(model, "-p", text, "-n", "6", "--temp", "0")
    assert a[0] == b[0] and a[1]["prompt"] == b[1]["prompt"]


# ------------------------------------------- sampling determinism and -n

def test_same_seed_same_output(model):
    args = ("-p", "Once upon a time", "-n", "24", "--seed", "1234")
    a, b = generate(model, *args), generate(model, *args)
    assert a[0] == b[0] and a[1]["generated"] == b[1]["generated"]
    ids_a, _ = generate_ids(model, *args)
    assert ids_a == generate_ids(model, *args)[0]
    # and the seed matters (the default sampling is not greedy)
    assert generate_ids(model, "-p", "Once upon a time", "-n", "24", "--seed", "4321")[0] != ids_a


def test_greedy_is_deterministic(model):
    a = generate_ids(model, "-p", "Once upon a time", "-n", "16", "--temp", "0", "--seed", "1")[0]
    b = generate_ids(model, "-p", "Once upon a time", "-n", "16", "--temp", "0", "--seed", "99")[0]
    assert a == b
    assert generate(model, "-p", "Once upon a time", "-n", "16", "--temp", "0")[0] == \
        generate(model, "-p", "Once upon a time", "-n", "16", "--temp", "0")[0]


@pytest.mark.parametrize("n", [0, 1, 7])
def test_n_limits_generated_tokens(model, n):
    ids, st = generate_ids(model, "-p", "Hello", "-n", str(n), "--seed", "5", "--ignore-eos")
    assert len(ids) == n and st["generated"] == n
    out, st = generate(model, "-p", "Hello", "-n", str(n), "--seed", "5")
    assert st["generated"] <= n


def test_eos_ends_generation(scripted):
    d, chain, eos = scripted
    ids, st = generate_ids(d, "-p", "Hello", "--temp", "0")
    assert ids == chain  # the end token is not printed...
    assert st["generated"] == len(chain) + 1  # ...but it was generated
    ids, st = generate_ids(d, "-p", "Hello", "--temp", "0", "--ignore-eos", "-n", str(len(chain) + 3))
    assert ids[:len(chain) + 1] == chain + [eos] and len(ids) == len(chain) + 3


# ------------------------------------------------------ streaming UTF-8

@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_streamed_text_is_the_decoded_ids(model, token_bytes, seed):
    """Text mode prints the ids that --print-ids prints for the same seed
    (same sampling, same ids), decoded: valid UTF-8, and byte for byte what
    `tokenize --decode` gives. Ids past the tokenizer (the model's vocab is
    larger) print nothing, so they are left out of the decode."""
    args = ("-p", "Hello", "-n", "48", "--seed", str(seed), "--temp", "1", "--top-k", "0", "--top-p", "1")
    ids, st_ids = generate_ids(model, *args)
    out, st = generate(model, *args)
    assert st["generated"] == st_ids["generated"]
    out.decode("utf-8")  # strict: raises on invalid UTF-8
    assert out == decode(model, [i for i in ids if i in token_bytes])
    assert out == lossy(token_bytes, ids)


def test_streamed_utf8_split_characters(scripted, token_bytes):
    d, chain, _ = scripted
    assert generate_ids(d, "-p", "Hello", "--temp", "0")[0] == chain
    out, _ = generate(d, "-p", "Hello", "--temp", "0")
    assert out == CHAIN_TEXT
    assert out == decode(d, chain) == lossy(token_bytes, chain)


@pytest.mark.parametrize("n, text", [
    (1, " world"),
    (2, " world\ufffd"),       # e4 bd held back, flushed as one U+FFFD at the end
    (3, " world你"),
    (4, " world你 \ufffd"),
    (5, " world你 🙂"),
    (6, " world你 🙂 \ufffd"),
    (7, " world你 🙂 \ufffd"),  # e5 a5: still one incomplete character
    (8, " world你 🙂 好"),
    (9, " world你 🙂 好\ufffd"),
    (10, " world你 🙂 好\ufffd!"),
])
def test_streamed_utf8_cut_by_n(scripted, n, text):
    """-n ending inside a character: the held-back bytes come out as one
    U+FFFD, exactly as `tokenize --decode` of the same ids."""
    d, chain, _ = scripted
    out, st = generate(d, "-p", "Hello", "--temp", "0", "-n", str(n))
    assert st["generated"] == n
    assert out == text.encode() == decode(d, chain[:n])


# ------------------------------------------------------------------ --stop

def test_stop_string_from_the_middle(model):
    out, _ = generate(model, "-p", "The weather today", "-n", "40", "--temp", "0")
    text = out.decode()
    # three characters from the middle; not U+FFFD (it stands for bytes that
    # were no character) and not NUL (cannot be an argument)
    start = next(i for i in range(len(text) // 2, len(text) - 2) if not {"\ufffd", "\x00"} & set(text[i:i + 3]))
    stop = text[start:start + 3]
    cut, st = generate(model, "-p", "The weather today", "-n", "40", "--temp", "0", "--stop", stop)
    assert cut == text[:text.index(stop)].encode()
    assert cut != out


@pytest.mark.parametrize("stops, text, generated", [
    (["你 🙂"], " world", 5),                        # across tokens and split characters
    (["done"], " world你 🙂 好\ufffd!\ufffd\x00 ", 13),  # after a NUL byte in the text
    (["ld", "wor"], " ", 1),                         # the earliest match wins, whatever the order
    (["wor", "ld"], " ", 1),
    (["\ufffd!"], " world你 🙂 好", 10),               # matched against the printed text
    (["ne!"], CHAIN_TEXT.decode(), 16),              # held-back prefix "ne" printed at the end
    (["zzz"], CHAIN_TEXT.decode(), 16),
], ids=["split-chars", "after-nul", "earliest-1", "earliest-2", "replacement-char", "held-back-tail", "absent"])
def test_stop_strings(scripted, stops, text, generated):
    d, chain, _ = scripted
    args = [a for s in stops for a in ("--stop", s)]
    out, st = generate(d, "-p", "Hello", "--temp", "0", *args)
    assert out == text.encode()
    assert st["generated"] == generated


# -------------------------------------------------------------------- chat

def chat(model, lines, *args):
    p = ok(["chat", "-m", model, *T1, "-n", "8", "--temp", "0", "--seed", "1", *args],
           stdin="".join(line + "\n" for line in lines).encode())
    return p, stats_lines(p)


def first_answer(model, user, *args):
    """The greedy ids and text of a first chat turn, from `generate --chat`,
    and whether it ended at an end-of-turn token."""
    ids, st = generate_ids(model, "--chat", "-p", user, "-n", "8", "--temp", "0", *args)
    text, _ = generate(model, "--chat", "-p", user, "-n", "8", "--temp", "0", *args)
    return ids, text, len(ids) < st["generated"]


def test_chat_keeps_the_kv_cache(model):
    """The second turn feeds only its new tokens: the last answer token that
    was sampled but not yet fed (unless it was the end token), the closing
    <|im_end|>\\n, the user turn and the assistant header. Its answer is the
    greedy continuation of the whole conversation."""
    ids1, text1, eos1 = first_answer(model, "hello")
    p, st = chat(model, ["hello", "second message"])
    assert len(st) == 2, shown(p)
    turn1 = tokenize(model, chat_turn("hello"))
    turn2 = ([] if eos1 else ids1[-1:]) + tokenize(model, IM_END + "\n" + chat_turn("second message"))
    assert st[0]["prompt"] == len(turn1)
    assert st[1]["prompt"] == len(turn2)
    history = turn1 + (ids1 if eos1 else ids1[:-1]) + turn2
    text2, _ = generate(model, "--ids", ",".join(map(str, history)), "-n", "8", "--temp", "0")
    assert p.stdout == text1 + b"\n" + text2 + b"\n"


@pytest.mark.parametrize("penalty", [[], ["--repeat-penalty", "1.5"]], ids=["plain", "repeat-penalty"])
def test_chat_reset(model, penalty):
    """/reset starts afresh, the repetition penalty's memory of the tokens seen included."""
    p, st = chat(model, ["hello", "/reset", "hello"], *penalty)
    first = len(tokenize(model, chat_turn("hello")))
    assert [s["prompt"] for s in st] == [first, first], shown(p)
    assert "conversation cleared" in p.stderr.decode()
    half = len(p.stdout) // 2  # the same state gives the same greedy answer
    assert p.stdout[:half] == p.stdout[half:] and p.stdout.endswith(b"\n"), shown(p)


def test_chat_system_and_no_think(model, token_bytes):
    ids1, _, _ = first_answer(model, "hi /no_think", "--system", "Be brief.")
    p, st = chat(model, ["hi /no_think", "more", "/reset", "again"], "--system", "Be brief.")
    turn1 = tokenize(model, chat_turn("hi /no_think", "Be brief.", think=False))
    answer1 = decode(model, [i for i in ids1 if i in token_bytes]).decode()
    expect = [
        turn1,
        # back to the header's "\n", and the answer again as text without the empty think block
        tokenize(model, "\n" + answer1 + IM_END + "\n" + chat_turn("more")),  # system once
        tokenize(model, chat_turn("again", "Be brief.")),  # after /reset: the system turn again
    ]
    assert [s["prompt"] for s in st] == [len(e) for e in expect], shown(p)


def render(messages, think):
    """Qwen3's own chat template (tokenizer_config.json), rendered as transformers renders it, with the
    generation prompt."""
    import jinja2.sandbox
    with open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, enable_thinking=think)


def test_chat_history_drops_the_reasoning(reasoning):
    """Earlier answers stay in the conversation as Qwen3's template renders them: without their reasoning,
    and without the empty think block a turn without thinking opens with. Each turn's prompt is what the
    template adds to the conversation after where the last answer starts."""
    msgs, thinks = ["first", "second /no_think", "third"], [True, False, True]
    answers = [THOUGHT_ANSWER, ANSWER, THOUGHT_ANSWER]
    p, st = chat(reasoning, msgs, "--system", "S")
    assert p.stdout.decode() == "".join(a + "\n" for a in answers), shown(p)
    history, held = [{"role": "system", "content": "S"}], 0
    for k, (m, think) in enumerate(zip(msgs, thinks)):
        history.append({"role": "user", "content": m})
        assert st[k]["prompt"] == len(tokenize(reasoning, render(history, think))) - held, (k, shown(p))
        held = len(tokenize(reasoning, render(history, True))) - 1  # up to "<|im_start|>assistant"
        history.append({"role": "assistant", "content": answers[k]})
    assert "Hm" not in render(history[:-1], True)  # the template does drop it


def follow_template(d, token_bytes, msgs, thinks, *args, no_think=False):
    """Runs a chat of msgs (system message "Be brief.") and checks every answer against `generate`'s greedy
    continuation, with the same args (sampling), of the conversation so far as the template renders it (thinks: each
    turn's thinking), and every turn's prompt against what the template adds after where the last answer
    starts."""
    p, st = chat(d, msgs, "--system", "Be brief.", *args, *(["--no-think"] if no_think else []))
    history, held, out = [{"role": "system", "content": "Be brief."}], 0, b""
    for k, (m, think) in enumerate(zip(msgs, thinks)):
        history.append({"role": "user", "content": m})
        ids = ",".join(map(str, tokenize(d, render(history, think))))
        text, _ = generate(d, "--ids", ids, "-n", "8", "--temp", "0", *args)
        answer, _ = generate_ids(d, "--ids", ids, "-n", "8", "--temp", "0", *args)
        out += text + b"\n"
        assert st[k]["prompt"] == len(ids.split(",")) - held, (k, shown(p))
        held = len(tokenize(d, render(history, True))) - 1  # up to "<|im_start|>assistant"
        history.append({"role": "assistant", "content": decode(d, [i for i in answer if i in token_bytes]).decode()})
    assert p.stdout == out, shown(p)
    return out


@pytest.mark.parametrize("penalty", [[], ["--repeat-penalty", "1.8"]], ids=["plain", "repeat-penalty"])
def test_chat_follows_the_template(model, token_bytes, penalty):
    """Without thinking, every answer is the greedy continuation of the conversation as the template
    renders it (with a repetition penalty, over the tokens of that conversation, as `generate` has it)."""
    follow_template(model, token_bytes, ["hello", "go on", "and then?", "fine"], [False] * 4, *penalty, no_think=True)


def test_chat_penalty_sees_the_whole_conversation(reasoning, token_bytes):
    """The repetition penalty covers the whole conversation in the cache, not just the latest turn: the
    first message's <think> makes the second answer (thinking on) leave the script, as `generate` over the
    rendered conversation does."""
    out = follow_template(reasoning, token_bytes, ["say <think> /no_think", "more /think"], [False, True],
                          "--repeat-penalty", "100")
    assert not out.split(b"\n")[-2].startswith(b"<think>Hm"), out


def test_chat_message_past_the_context_starts_over(model):
    """A message that no longer fits after the conversation so far is answered
    from a cleared conversation (as after an answer that fills the context),
    not dropped; one that cannot fit even alone is an error naming --ctx."""
    first = len(tokenize(model, chat_turn("hello")))
    p, st = chat(model, ["hello", "again"], "--ctx", str(first + 10))
    assert [s["prompt"] for s in st] == [first, len(tokenize(model, chat_turn("again")))], shown(p)
    assert "context full: conversation cleared" in p.stderr.decode(), shown(p)
    p = run(["chat", "-m", model, *T1, "-n", "2", "--temp", "0", "--ctx", str(first - 1)], stdin=b"hello\nhello\n")
    assert p.returncode == 1 and b"--ctx" in p.stderr and not stats_lines(p), shown(p)


@pytest.mark.parametrize("default, msg, think", [
    ([], "plain", True),
    (["--no-think"], "plain", False),
    ([], "please /no_think", False),
    (["--no-think"], "please /think", True),
    ([], "a /think b /no_think c", False),
    ([], "a /no_think b /think c", True),
    ([], "/think a /no_think b /think", True),      # the last switch wins
    ([], "/no_think a /think b /no_think", False),
])
def test_chat_think_switches(model, default, msg, think):
    p, st = chat(model, [msg], *default)
    assert [s["prompt"] for s in st] == [len(tokenize(model, chat_turn(msg, think=think)))], shown(p)


@pytest.mark.parametrize("stdin, turns", [
    (b"", 0),
    (b"\n\nhello\n\n", 1),      # blank lines are no turns
    (b"hello", 1),              # last line without a newline
    (b"hello\r\n/exit\nnever\n", 1),
    (b"/quit\nhello\n", 0),
])
def test_chat_end_of_input(model, stdin, turns):
    p = ok(["chat", "-m", model, *T1, "-n", "2", "--temp", "0"], stdin=stdin)
    st = stats_lines(p)
    assert len(st) == turns, shown(p)
    if turns:
        assert st[0]["prompt"] == len(tokenize(model, chat_turn("hello")))


# -------------------------------------------------------------- context

LONG = "The quick brown fox jumps over the lazy dog, again and again, until the dog wakes up."


def test_prompt_longer_than_ctx(model):
    assert len(tokenize(model, LONG)) > 16
    p = run(["generate", "-m", model, *T1, "--ctx", "16", "-p", LONG, "-n", "4"])
    assert p.returncode != 0 and p.returncode < 128, shown(p)
    err = p.stderr.decode()
    assert "error" in err and "does not fit" in err and "16" in err and "--ctx" in err, shown(p)
    assert p.stdout == b""


@pytest.mark.parametrize("print_ids", [True, False])
def test_generation_stops_at_context_end(model, print_ids):
    """The last sampled token is never fed, so it needs no cache slot:
    ctx - prompt + 1 tokens come out, then a note, and exit 0."""
    n_prompt = len(tokenize(model, "Hello world"))
    args = ("-p", "Hello world", "--ctx", "16", "-n", "100", "--ignore-eos", "--seed", "3")
    if print_ids:
        ids, st = generate_ids(model, *args)
        assert len(ids) == 16 - n_prompt + 1
    else:
        _, st = generate(model, *args)
    assert st["generated"] == 16 - n_prompt + 1 and st["note"] == CTX_FULL


def test_prompt_that_exactly_fills_ctx(model):
    n = len(tokenize(model, LONG))
    ids, st = generate_ids(model, "-p", LONG, "--ctx", str(n), "-n", "5", "--ignore-eos")
    assert len(ids) == 1 and st["prompt"] == n and st["note"] == CTX_FULL


def test_chat_context_full_clears_the_conversation(model):
    first = len(tokenize(model, chat_turn("hello")))
    ids, _, eos = first_answer(model, "hello")
    assert not eos and len(ids) == 8, "the greedy answer must run into the context end"
    p = ok(["chat", "-m", model, *T1, "--ctx", str(first + 4), "-n", "50", "--temp", "0"],
           stdin=b"hello\nhello\n")
    st = stats_lines(p)
    assert [(s["prompt"], s["generated"], s["note"]) for s in st] == [(first, 5, CTX_FULL)] * 2, shown(p)
    assert "context full: conversation cleared" in p.stderr.decode()


def test_chat_turn_that_does_not_fit(model):
    """A turn too long for the context is an error (exit 1 at the end), the
    conversation is cleared and the next turn starts afresh."""
    first = len(tokenize(model, chat_turn("hello")))
    p = run(["chat", "-m", model, *T1, "--ctx", "24", "-n", "2", "--temp", "0"],
            stdin=f"hello\n{LONG}\nhello\n".encode())
    assert p.returncode == 1, shown(p)
    err = p.stderr.decode()
    assert "does not fit" in err and "conversation cleared" in err, shown(p)
    assert [s["prompt"] for s in stats_lines(p)] == [first, first], shown(p)
