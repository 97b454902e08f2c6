"""`q3moe convert`, the .q3m file format, and the `--quant` compile cache.

The .q3m layout is parsed here independently from its description in
src/io/q3m.h (parse_q3m). MX tensors are checked byte for byte against
tools/mx_ref.py applied to the original weights; tensors kept as stored must
be the safetensors bytes. Damaged files (each made by editing a good one and,
where the damage is past the header checks, re-computing the header checksum)
must be refused with a message naming the file. The cache tests point
Q3MOE_CACHE_DIR / XDG_CACHE_HOME / HOME at temporary directories.

Numerical agreement of quantized models with a Python reference is
tests/test_quant_reference.py's job; here only the file, its decoding and the
plumbing are tested (plus bit-identity for an unquantized conversion).

Binary: $Q3MOE (default build/q3moe); the damaged-file tests prefer
$Q3MOE_ASAN when it exists and then also require no sanitizer report.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
Q3MOE = os.environ.get("Q3MOE") or str(REPO / "build" / "q3moe")
_ASAN = os.environ.get("Q3MOE_ASAN") or ""
Q3MOE_CHECK = _ASAN if _ASAN and os.access(_ASAN, os.X_OK) else Q3MOE
TOKENIZER_DIR = REPO / "build" / "tokenizer"
sys.path.insert(0, str(REPO / "tools"))
import mx_ref  # noqa: E402

SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
TIMEOUT_S = 600
IDS = [1, 17, 200, 3, 511, 42, 7, 300]

SCHEMES = {  # name: (--ffn, --attn, --act)
    "w4a8": ("mxfp4", "mxfp8", "mxfp8"),
    "w8a8": ("mxfp8", "mxfp8", "mxfp8"),
    "w4a8i": ("mxfp4", "mxint8", "mxint8"),
    "w4": ("mxfp4", "mxfp4", "none"),
    "w8": ("mxfp8", "mxfp8", "none"),
    "bf16": ("bf16", "bf16", "none"),
}


def run(args, env=None, check=True, binary=None):
    e = dict(os.environ)
    e.update(SAN_ENV)
    if env:
        e.update(env)
    cmd = [binary or Q3MOE] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=e, timeout=TIMEOUT_S)
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}"
    assert "Sanitizer" not in p.stderr and "runtime error:" not in p.stderr, p.stderr
    return p


def synth(d, *extra):
    run(["synth", "-o", d, "--preset", "tiny", "--layers", "2", *extra])
    return d


def convert(src, dst, scheme="w4a8", *extra, env=None):
    ffn, attn, act = SCHEMES[scheme]
    return run(["convert", "-m", src, "-o", dst, "--ffn", ffn, "--attn", attn, "--act", act, *extra], env=env)


def logits(m, out, *extra, env=None, ids=IDS):
    p = run(["logits", "-m", m, "--ids", ",".join(map(str, ids)), "-o", out, "--force", *extra], env=env)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1), p


# ------------------------------------------------------- the file format

DTYPES = {0: "F32", 1: "F16", 2: "BF16", 3: "MXFP8", 4: "MXFP4", 5: "MXINT8", 6: "BF16P"}
SECTIONS = {1: "config.json", 2: "tokenizer.json", 3: "tokenizer_config.json"}
FNV_BASIS, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a(data, h=FNV_BASIS):
    # vectorised over bytes would not be FNV; tables are small enough
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def parse_q3m(raw):
    """Parse a .q3m from its description in src/io/q3m.h."""
    assert raw[:8] == b"Q3MOE\0PK"
    version, hsize = struct.unpack_from("<II", raw, 8)
    engine = raw[16:48].rstrip(b"\0").decode()
    fsize, toff, tsize, doff = struct.unpack_from("<QQQQ", raw, 48)
    n_secs, n_ts = struct.unpack_from("<II", raw, 80)
    ffn, attn, act = raw[88], raw[89], raw[90]
    (checksum,) = struct.unpack_from("<Q", raw, 120)
    hdr = dict(version=version, header_size=hsize, engine=engine, file_size=fsize, table_offset=toff,
               table_size=tsize, data_offset=doff, n_sections=n_secs, n_tensors=n_ts,
               scheme=(DTYPES[ffn], DTYPES[attn], act), checksum=checksum)
    p = toff
    secs = {}
    for _ in range(n_secs):
        kind, _zero, off, size, ck = struct.unpack_from("<IIQQQ", raw, p)
        secs[SECTIONS[kind]] = dict(offset=off, size=size, checksum=ck, record=p)
        p += 32
    tensors = {}
    for _ in range(n_ts):
        nl, code, nd, _zero = struct.unpack_from("<HBBI", raw, p)
        shape = struct.unpack_from("<4q", raw, p + 8)[:nd]
        do, ds, so, ss = struct.unpack_from("<4Q", raw, p + 40)
        name = raw[p + 72:p + 72 + nl].decode()
        tensors[name] = dict(dtype=DTYPES[code], shape=list(shape), data_offset=do, data_size=ds,
                             scales_offset=so, scales_size=ss, record=p)
        p += 72 + (nl + 7) // 8 * 8
    assert p == toff + tsize
    return hdr, secs, tensors


def table_checksum(raw):
    toff, tsize = struct.unpack_from("<QQ", raw, 56)
    return fnv1a(raw[toff:toff + tsize], fnv1a(raw[:120]))


def with_checksum(raw):
    raw = bytearray(raw)
    struct.pack_into("<Q", raw, 120, table_checksum(raw))
    return bytes(raw)


def read_safetensors(d):
    """name -> (dtype string, shape, raw bytes) over every file of a checkpoint dir."""
    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        for k, v in header.items():
            if k == "__metadata__":
                continue
            b0, b1 = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], raw[8 + n + b0:8 + n + b1])
    return out


def to_f32(dtype, shape, data):
    if dtype == "F32":
        return np.frombuffer(data, "<f4").reshape(shape)
    if dtype == "F16":
        return np.frombuffer(data, "<f2").astype(np.float32).reshape(shape)
    assert dtype == "BF16"
    u = np.frombuffer(data, "<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape)


def kind(name):
    if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                      "self_attn.o_proj.weight")):
        return "attn"
    if ".mlp." in name and name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight")):
        return "ffn"
    return "other"


# --------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """MoE checkpoint, vocab 512, no tokenizer, BF16."""
    return synth(tmp_path_factory.mktemp("ck") / "tiny", "--vocab", "512", "--tokenizer", "none")


@pytest.fixture(scope="session")
def tiny_tok(tmp_path_factory):
    """The real Qwen3 tokenizer (full vocabulary; hidden 64 and tied to stay small), mixed dtypes."""
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        pytest.skip(f"no {TOKENIZER_DIR}/tokenizer.json (run make)")
    return synth(tmp_path_factory.mktemp("ck") / "tok", "--hidden", "64", "--tie", "1", "--dtype", "mixed",
                 "--tokenizer", TOKENIZER_DIR)


@pytest.fixture(scope="session")
def converted(tiny, tmp_path_factory):
    """scheme -> .q3m of `tiny` (made once)."""
    root, made = tmp_path_factory.mktemp("q3m"), {}

    def get(scheme):
        if scheme not in made:
            made[scheme] = root / f"tiny-{scheme}.q3m"
            convert(tiny, made[scheme], scheme)
        return made[scheme]

    return get


@pytest.fixture
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("w")


# ------------------------------------------------------------ conversion

@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_scheme_layout_and_run(tiny, converted, tmp_path, scheme):
    path = converted(scheme)
    raw = path.read_bytes()
    hdr, secs, tensors = parse_q3m(raw)
    ffn, attn, act = SCHEMES[scheme]
    assert hdr["version"] == 1 and hdr["header_size"] == 128 and hdr["engine"].startswith("q3moe")
    assert hdr["file_size"] == len(raw) and hdr["table_offset"] == 128
    assert hdr["checksum"] == table_checksum(raw)
    assert hdr["scheme"] == ({"bf16": "BF16"}.get(ffn, ffn.upper()), {"bf16": "BF16"}.get(attn, attn.upper()),
                             {"mxfp8": 1, "mxint8": 2}.get(act, 0))
    assert list(secs) == ["config.json"]  # no tokenizer in this checkpoint
    src = read_safetensors(tiny)
    assert set(tensors) == set(src)
    blobs = []
    for name, t in tensors.items():
        st_dtype, st_shape, st_bytes = src[name]
        assert t["shape"] == st_shape
        want = {"ffn": ffn, "attn": attn}.get(kind(name), "bf16")
        if want == "bf16":  # kept as stored, byte for byte
            assert t["dtype"] == st_dtype and t["scales_size"] == 0 and t["scales_offset"] == 0
            assert raw[t["data_offset"]:t["data_offset"] + t["data_size"]] == st_bytes, name
        else:
            rows, cols = st_shape
            assert t["dtype"] == want.upper()
            assert t["data_size"] == rows * cols // (2 if want == "mxfp4" else 1)
            assert t["scales_size"] == rows * cols // 32
            blobs.append((t["scales_offset"], t["scales_size"]))
        blobs.append((t["data_offset"], t["data_size"]))
    blobs += [(s["offset"], s["size"]) for s in secs.values()]
    blobs.sort()
    assert all(o % 64 == 0 and o >= hdr["data_offset"] for o, _ in blobs)
    assert all(a[0] + a[1] <= b[0] for a, b in zip(blobs, blobs[1:]))
    assert blobs[-1][0] + blobs[-1][1] == len(raw)
    n_mx = sum(t["dtype"].startswith("MX") for t in tensors.values())
    assert n_mx == (0 if scheme == "bf16" else sum(kind(n) != "other" for n in tensors))

    got, _ = logits(path, tmp_path / "q.f32")
    assert got.shape == (len(IDS), 512) and np.isfinite(got).all()
    if scheme == "bf16":
        ref, _ = logits(tiny, tmp_path / "ref.f32")
        assert got.tobytes() == ref.tobytes(), "bf16/none conversion must give bit-identical logits"


def test_mx_tensors_decode_to_mx_ref(tiny, converted):
    """Quantized bytes == tools/mx_ref.py on the original weights, for a few tensors of each kind."""
    src = read_safetensors(tiny)
    picks = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight",
             "model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.15.down_proj.weight"]
    for scheme in ("w4a8", "w8", "w4a8i"):
        raw = converted(scheme).read_bytes()
        _, _, tensors = parse_q3m(raw)
        for name in picks:
            t = tensors[name]
            x = to_f32(*src[name][:2], src[name][2])
            q = {"MXFP4": mx_ref.quantize_mxfp4, "MXFP8": mx_ref.quantize_mxfp8, "MXINT8": mx_ref.quantize_mxint8}[t["dtype"]]
            scales, elems = q(x)
            got_e = raw[t["data_offset"]:t["data_offset"] + t["data_size"]]
            got_s = raw[t["scales_offset"]:t["scales_offset"] + t["scales_size"]]
            assert got_e == elems.tobytes(), f"{scheme} {name}: element bytes differ from mx_ref"
            assert got_s == scales.tobytes(), f"{scheme} {name}: scale bytes differ from mx_ref"


def test_unquantized_conversion_is_exact_mixed_dtypes(tiny_tok, tmp_path):
    """--ffn bf16 --attn bf16 --act none on a mixed F32/F16/BF16 tied checkpoint: same logits, bit for bit."""
    out = tmp_path / "m.q3m"
    convert(tiny_tok, out, "bf16")
    ids = [9707, 11, 1879, 0, 151643, 151644, 5000]
    a, _ = logits(out, tmp_path / "a.f32", ids=ids)
    b, _ = logits(tiny_tok, tmp_path / "b.f32", ids=ids)
    assert a.tobytes() == b.tobytes()


def test_embedded_config_and_tokenizer(tiny_tok, tmp_path):
    out = tmp_path / "m.q3m"
    convert(tiny_tok, out, "w4a8")
    raw = out.read_bytes()
    _, secs, _ = parse_q3m(raw)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        s = secs[name]
        body = raw[s["offset"]:s["offset"] + s["size"]]
        assert body == (tiny_tok / name).read_bytes(), f"{name} is not embedded verbatim"
        if s["size"] < 100000:  # pure-Python FNV is slow on the 11 MB tokenizer.json
            assert s["checksum"] == fnv1a(body)
    for text in ["Hello, world!", "<|im_start|>user\nhi<|im_end|>", "naïve café 東京 🙂", "  spaces\t\n"]:
        a = run(["tokenize", "-m", out, "-p", text]).stdout
        b = run(["tokenize", "-m", tiny_tok, "-p", text]).stdout
        assert a == b, text
    a = run(["tokenize", "-m", out, "--decode", "--ids", "9707,11,1879"]).stdout
    assert a == run(["tokenize", "-m", tiny_tok, "--decode", "--ids", "9707,11,1879"]).stdout == "Hello, world"
    # the model commands find the tokenizer inside the file: a text prompt works without the directory
    moved = tmp_path / "elsewhere.q3m"
    shutil.copy(out, moved)
    p = run(["generate", "-m", moved, "-p", "Hello", "-n", "3", "--temp", "0", "--print-ids"])
    assert len(json.loads(p.stdout.strip())) >= 1


def test_no_tokenizer_in_file(converted, tmp_path):
    p = run(["generate", "-m", converted("w4a8"), "-p", "Hello", "-n", "2"], check=False)
    assert p.returncode == 1 and str(converted("w4a8")) in p.stderr and "tokenizer" in p.stderr
    p = run(["tokenize", "-m", converted("w4a8"), "-p", "x"], check=False)
    assert p.returncode == 1 and "no embedded tokenizer.json" in p.stderr


def test_deterministic(tiny, converted, tmp_path):
    out = tmp_path / "again.q3m"
    convert(tiny, out, "w4a8")
    assert out.read_bytes() == converted("w4a8").read_bytes()


def test_refuses_to_overwrite(tiny, tmp_path):
    out = tmp_path / "m.q3m"
    out.write_bytes(b"precious")
    p = run(["convert", "-m", tiny, "-o", out], check=False)
    assert p.returncode == 1 and str(out) in p.stderr and "--force" in p.stderr
    assert out.read_bytes() == b"precious"
    run(["convert", "-m", tiny, "-o", out, "--force", "-q"])
    assert out.read_bytes()[:8] == b"Q3MOE\0PK"
    assert sorted(os.listdir(tmp_path)) == ["m.q3m"], "temporary file left behind"
    p = run(["convert", "-m", tiny, "-o", tmp_path], check=False)
    assert p.returncode == 1 and "directory" in p.stderr


def test_summary_and_progress(tiny, tmp_path):
    p = run(["convert", "-m", tiny, "-o", tmp_path / "m.q3m"])
    assert "tensors" in p.stderr and "GB in" in p.stderr and "GB out" in p.stderr
    p = run(["convert", "-m", tiny, "-o", tmp_path / "n.q3m", "-q"])
    assert p.stderr == ""


def _edit_safetensors(d, name, edit):
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    b0, _ = header[name]["data_offsets"]
    edit(raw, 8 + n + b0)
    f.write_bytes(bytes(raw))


@pytest.mark.parametrize("value,word", [(0x7FC0, "NaN"), (0xFF80, "infinity")])
def test_non_finite_weight_refused(tiny, work, value, word):
    d = work / "ck"
    shutil.copytree(tiny, d)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    _edit_safetensors(d, name, lambda raw, off: struct.pack_into("<H", raw, off + 2 * 70, value))
    out = work / "m.q3m"
    p = run(["convert", "-m", d, "-o", out], check=False, binary=Q3MOE_CHECK)
    assert p.returncode == 1 and name in p.stderr and word in p.stderr and "[0, 70]" in p.stderr
    assert str(d / "model.safetensors") in p.stderr, f"the source file is not named:\n{p.stderr}"
    assert not out.exists() and sorted(os.listdir(work)) == ["ck"], "partial output left behind"
    # the same tensor kept as stored converts fine
    run(["convert", "-m", d, "-o", out, "--ffn", "bf16", "-q"])


def test_dimension_not_multiple_of_32_refused(work):
    d = synth(work / "ck", "--vocab", "512", "--tokenizer", "none", "--moe-ffn", "48")
    out = work / "m.q3m"
    p = run(["convert", "-m", d, "-o", out], check=False, binary=Q3MOE_CHECK)
    assert p.returncode == 1 and "down_proj.weight" in p.stderr and "48" in p.stderr and "32" in p.stderr
    assert not out.exists()
    run(["convert", "-m", d, "-o", out, "--ffn", "bf16", "-q"])  # attention dims are fine


def test_bad_arguments(tiny, converted, tmp_path):
    for args in (["--ffn", "int4"], ["--attn", "fp8"], ["--act", "mxfp4"], ["--quant", "w3a3"], ["--bogus"]):
        p = run(["convert", "-m", tiny, "-o", tmp_path / "x.q3m", *args], check=False)
        assert p.returncode == 2 and args[-1] in p.stderr
    p = run(["convert", "-m", converted("w4a8"), "-o", tmp_path / "x.q3m"], check=False)
    assert p.returncode == 1 and "already" in p.stderr
    p = run(["convert", "-m", tmp_path / "nope", "-o", tmp_path / "x.q3m"], check=False)
    assert p.returncode == 1 and "nope" in p.stderr
    assert not (tmp_path / "x.q3m").exists()


# ---------------------------------------------------------- damaged files

def _tensor(tensors, name):
    return tensors[name]


def damage_cases(raw):
    _, secs, tensors = parse_q3m(raw)
    a = tensors["model.layers.0.mlp.experts.0.gate_proj.weight"]
    b = tensors["model.layers.0.mlp.experts.1.gate_proj.weight"]
    cases = {}
    cases["bad_magic"] = (b"Q3MOE\0XX" + raw[8:], ["bad magic"])
    v2 = bytearray(raw)
    struct.pack_into("<I", v2, 8, 2)
    cases["other_version"] = (with_checksum(v2), ["version 2", "re-convert"])
    cases["truncated"] = (raw[: len(raw) - 1000], ["truncated"])
    cases["truncated_header"] = (raw[:100], ["truncated"])
    cases["empty"] = (b"", ["not a q3moe model file"])
    cases["text_file"] = (b'{"model_type": "qwen3_moe"}\n', ["bad magic"])
    past = bytearray(raw)
    struct.pack_into("<Q", past, a["record"] + 40, len(raw) + 64 * 100)
    cases["offset_past_end"] = (with_checksum(past), ["outside the data region", "gate_proj"])
    scales_past = bytearray(raw)
    struct.pack_into("<Q", scales_past, a["record"] + 56, len(raw) - 64)
    cases["scales_past_end"] = (with_checksum(scales_past), ["outside the data region", "scales"])
    ov = bytearray(raw)
    struct.pack_into("<Q", ov, b["record"] + 40, a["data_offset"])
    cases["overlap"] = (with_checksum(ov), ["overlaps", "experts.0.gate_proj", "experts.1.gate_proj"])
    mis = bytearray(raw)
    struct.pack_into("<Q", mis, a["record"] + 40, a["data_offset"] + 8)
    cases["misaligned"] = (with_checksum(mis), ["multiple of 64"])
    shp = bytearray(raw)
    struct.pack_into("<q", shp, a["record"] + 8, a["shape"][0] * 2)
    cases["shape_vs_size"] = (with_checksum(shp), ["experts.0.gate_proj", "need"])
    odd = bytearray(raw)
    struct.pack_into("<q", odd, a["record"] + 16, 48)
    cases["mx_cols_not_32"] = (with_checksum(odd), ["multiple of the MX block size"])
    dt = bytearray(raw)
    dt[a["record"] + 2] = 9
    cases["bad_dtype"] = (with_checksum(dt), ["dtype code 9"])
    ck = bytearray(raw)
    ck[a["record"] + 72] ^= 0x20  # a letter of a tensor name
    cases["checksum_table"] = (bytes(ck), ["checksum"])
    ck2 = bytearray(raw)
    ck2[89] = 4  # the scheme byte, under the checksum
    cases["checksum_header"] = (bytes(ck2), ["checksum"])
    cfg = bytearray(raw)
    cfg[secs["config.json"]["offset"] + 3] ^= 1
    cases["config_section"] = (bytes(cfg), ["config.json", "damaged"])
    nocfg = bytearray(raw)
    struct.pack_into("<I", nocfg, secs["config.json"]["record"], 7)
    cases["unknown_section"] = (with_checksum(nocfg), ["unknown kind 7"])
    cases["trailing"] = (raw + b"\0" * 64, ["trailing"])
    return cases


DAMAGE = ["bad_magic", "other_version", "truncated", "truncated_header", "empty", "text_file", "offset_past_end",
          "scales_past_end", "overlap", "misaligned", "shape_vs_size", "mx_cols_not_32", "bad_dtype",
          "checksum_table", "checksum_header", "config_section", "unknown_section", "trailing"]


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_file_refused(converted, work, case):
    raw = converted("w4a8").read_bytes()
    data, words = damage_cases(raw)[case]
    bad = work / "damaged.q3m"
    bad.write_bytes(data)
    p = run(["logits", "-m", bad, "--ids", "1,2", "-o", work / "o.f32"], check=False, binary=Q3MOE_CHECK)
    assert p.returncode == 1, p.stderr
    assert str(bad) in p.stderr, f"message does not name the file:\n{p.stderr}"
    for w in words:
        assert w in p.stderr, f"{w!r} not in:\n{p.stderr}"
    assert not (work / "o.f32").exists()


# ------------------------------------------------------------------ BF16P

def bf16p_decode(data, side, rows, cols):
    """BF16 words of a BF16P tensor, from the layout src/quant/bf16p.h describes."""
    g = np.frombuffer(data, np.uint8).reshape(rows, cols // 64, 100)
    hdr = g[..., 0:4].copy().view("<u4")[..., 0].astype(np.int64)
    L = g[..., 4:68].astype(np.int64)
    N = g[..., 68:100].astype(np.int64)
    nib = np.concatenate([N & 15, N >> 4], axis=-1)  # the nibble of L byte p
    p = np.arange(64)
    lane, i = p // 16, p % 16
    w = 8 * lane + i % 8
    elem = 16 * (i >= 8) + 32 * (w % 2) + w // 2  # the element L byte p holds
    off = np.stack([(hdr >> 7) & 0xFF, (hdr >> 23) & 0xFF], axis=-1)[..., elem // 32]
    code = ((nib & 7) << 1) | (L >> 7)
    word = ((nib >> 3) << 15) | (((code + off) & 0xFF) << 7) | (L & 0x7F)
    out = np.zeros((rows, cols // 64, 64), np.int64)
    out[..., elem] = word
    raw = (hdr & 0x8000) != 0
    if raw.any():
        idx = (hdr & 0x7FFF) | ((hdr >> 16) << 15)
        sw = np.frombuffer(side, "<u2").reshape(-1, 64).astype(np.int64)
        r = np.arange(64)
        raw_elem = np.where(r >= 32, 16, 0) + 32 * (r % 2) + (r % 32) // 2
        for rr, gg in zip(*np.nonzero(raw)):
            out[rr, gg, raw_elem] = sw[idx[rr, gg]]
    return out.astype("<u2").reshape(rows, cols).tobytes()


def test_bf16p_file_decodes_to_the_weights_and_runs_bit_identical(tiny, work):
    """--quant bf16p: every packed tensor decodes (by the documented layout) to the checkpoint's bytes; the
    logits, prefill and decode, on every kernel table, are the checkpoint's bit for bit."""
    out = work / "p.q3m"
    p = run(["convert", "-m", tiny, "-o", out, "--quant", "bf16p"])
    assert "ffn BF16P, attn BF16P, act fp32, lm_head BF16P" in p.stderr
    raw = out.read_bytes()
    hdr, _, tensors = parse_q3m(raw)
    assert hdr["scheme"][:2] == ("BF16P", "BF16P")
    src = read_safetensors(tiny)
    n_packed = n_raw = 0
    for name, t in tensors.items():
        st_dtype, st_shape, st_bytes = src[name]
        if kind(name) == "other" and name != "lm_head.weight":
            assert t["dtype"] == st_dtype and raw[t["data_offset"]:t["data_offset"] + t["data_size"]] == st_bytes
            continue
        rows, cols = st_shape
        assert t["dtype"] == "BF16P" and t["data_size"] == rows * cols // 64 * 100, name
        assert t["scales_size"] % 128 == 0 and (t["scales_size"] == 0) == (t["scales_offset"] == 0)
        data = raw[t["data_offset"]:t["data_offset"] + t["data_size"]]
        side = raw[t["scales_offset"]:t["scales_offset"] + t["scales_size"]]
        assert bf16p_decode(data, side, rows, cols) == st_bytes, name
        n_packed += 1
        n_raw += t["scales_size"] // 128
    assert n_packed == sum(kind(n) != "other" for n in tensors) + 1 and n_raw > 0
    for isa in ("scalar", "avx2", "avx512", "amx"):
        env = {"Q3MOE_ISA": isa}
        a, _ = logits(out, work / "a.f32", "--prefill", "5", env=env)
        b, _ = logits(tiny, work / "b.f32", "--prefill", "5", env=env)
        assert a.tobytes() == b.tobytes(), isa


def test_bf16p_needs_bf16_weights(tiny_tok, work):
    """bf16p packs BF16 values as they are; an F16/F32 tensor is named, with the flag that keeps it."""
    p = run(["convert", "-m", tiny_tok, "-o", work / "x.q3m", "--quant", "bf16p"], check=False)
    assert p.returncode == 1 and "bf16p packs BF16 weights" in p.stderr and "is stored as F" in p.stderr, p.stderr
    assert "use --ffn bf16" in p.stderr or "use --attn bf16" in p.stderr, p.stderr
    assert not (work / "x.q3m").exists()
    p = run(["convert", "-m", tiny_tok, "-o", work / "y.q3m", "--head", "bf16p"], check=False)
    assert p.returncode == 1 and "no separate lm_head.weight" in p.stderr, p.stderr  # tied: the embedding


def test_bf16p_scheme_on_a_tied_model(work):
    """--quant bf16p packs what it can: a tied model's embedding table (its lm_head) stays as stored,
    and the logits are bit-identical to the checkpoint's."""
    ck = synth(work / "tied", "--tie", "1", "--tokenizer", "none", "--vocab", "512")
    out = work / "t.q3m"
    run(["convert", "-m", ck, "-o", out, "--quant", "bf16p"])
    a, _ = logits(out, work / "a.f32")
    b, _ = logits(ck, work / "b.f32")
    assert a.tobytes() == b.tobytes()


def test_bf16p_damaged_side_table_refused(tiny, work):
    out = work / "p.q3m"
    run(["convert", "-m", tiny, "-o", out, "--quant", "bf16p"])
    raw = out.read_bytes()
    _, _, tensors = parse_q3m(raw)
    t = next(t for t in tensors.values() if t["dtype"] == "BF16P" and t["scales_size"])
    rows, cols = t["shape"]
    for size, words in ((t["scales_size"] - 64, ["need"]), (rows * cols // 64 * 128 + 128, ["need"])):
        bad = bytearray(raw)
        struct.pack_into("<Q", bad, t["record"] + 64, size)
        (work / "bad.q3m").write_bytes(with_checksum(bad))
        p = run(["logits", "-m", work / "bad.q3m", "--ids", "1,2", "-o", work / "o.f32"], check=False,
                binary=Q3MOE_CHECK)
        assert p.returncode == 1 and str(work / "bad.q3m") in p.stderr, p.stderr
        assert all(w in p.stderr for w in words), p.stderr


def test_damaged_tokenizer_section(tiny_tok, work):
    out = work / "m.q3m"
    convert(tiny_tok, out, "bf16")
    raw = bytearray(out.read_bytes())
    _, secs, _ = parse_q3m(bytes(raw))
    raw[secs["tokenizer.json"]["offset"] + 1000] ^= 1
    out.write_bytes(bytes(raw))
    for cmd in (["tokenize", "-m", out, "-p", "hi"], ["generate", "-m", out, "-p", "hi", "-n", "1"]):
        p = run(cmd, check=False, binary=Q3MOE_CHECK)
        assert p.returncode == 1 and str(out) in p.stderr and "tokenizer.json is damaged" in p.stderr


# --------------------------------------------------------------- the cache

def cache_env(root):
    return {"Q3MOE_CACHE_DIR": str(root)}


def q3m_files(d):
    return sorted(p for p in Path(d).iterdir() if p.suffix == ".q3m") if Path(d).exists() else []


def test_cache_convert_then_reuse_then_invalidate(tiny, converted, work):
    ck = work / "ck"
    shutil.copytree(tiny, ck)
    cache = work / "cache"
    env = cache_env(cache)
    first, p = logits(ck, work / "a.f32", "--quant", "w4a8", env=env)
    assert "converting" in p.stderr and "(first use)" in p.stderr and "using cached" not in p.stderr
    files = q3m_files(cache)
    assert len(files) == 1 and files[0].name.startswith("ck-w4a8-")
    assert [f.name for f in cache.iterdir()] == [files[0].name], "temporary files left in the cache"
    mtime = files[0].stat().st_mtime_ns
    # same bytes as an explicit conversion with the same scheme
    assert files[0].read_bytes() == converted("w4a8").read_bytes()

    time.sleep(0.05)
    second, p = logits(ck, work / "b.f32", "--quant", "w4a8", env=env)
    assert "using cached" in p.stderr and str(files[0]) in p.stderr and "converting" not in p.stderr
    assert q3m_files(cache) == files and files[0].stat().st_mtime_ns == mtime
    assert first.tobytes() == second.tobytes()
    direct, _ = logits(files[0], work / "c.f32")
    assert direct.tobytes() == first.tobytes()

    # another scheme: its own file, next to the first
    _, p = logits(ck, work / "d.f32", "--quant", "w8", env=env)
    assert "converting" in p.stderr and len(q3m_files(cache)) == 2

    # touching config.json changes the identity: converted again, the stale file removed
    st = (ck / "config.json").stat()
    os.utime(ck / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, p = logits(ck, work / "e.f32", "--quant", "w4a8", env=env)
    assert "converting" in p.stderr and "(first use)" in p.stderr
    now = [f for f in q3m_files(cache) if "-w4a8-" in f.name]
    assert len(now) == 1 and now[0] != files[0] and not files[0].exists()

    # so does a weight file
    st = (ck / "model.safetensors").stat()
    os.utime(ck / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, p = logits(ck, work / "f.f32", "--quant", "w4a8", env=env)
    assert "converting" in p.stderr


def test_cache_chat(tiny_tok, work):
    env = cache_env(work / "cache")
    for expect in ("(first use)", "using cached"):
        e = dict(os.environ, **SAN_ENV, **env)
        p = subprocess.run([Q3MOE, "chat", "-m", str(tiny_tok), "--quant", "w4a8", "--temp", "0", "-n", "3"],
                           input="Hello\n", capture_output=True, text=True, errors="replace", env=e,
                           timeout=TIMEOUT_S)
        assert p.returncode == 0 and expect in p.stderr, p.stderr


def test_cache_generate_and_bf16(tiny, work):
    env = cache_env(work / "cache")
    p = run(["generate", "-m", tiny, "--quant", "w4", "--ids", "1,2,3", "-n", "3", "--temp", "0", "--print-ids"],
            env=env)
    assert "(first use)" in p.stderr and len(json.loads(p.stdout.strip())) == 3
    p = run(["generate", "-m", tiny, "--quant", "w4", "--ids", "1,2,3", "-n", "3", "--temp", "0", "--print-ids"],
            env=env)
    assert "using cached" in p.stderr
    # bf16: a cached file that runs exactly like the directory
    a, _ = logits(tiny, work / "a.f32", "--quant", "bf16", env=env)
    b, _ = logits(tiny, work / "b.f32")
    assert a.tobytes() == b.tobytes()


def test_cache_location(tiny, work):
    home, xdg = work / "home", work / "xdg"
    home.mkdir()
    base = {"Q3MOE_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": str(home)}
    _, p = logits(tiny, work / "a.f32", "--quant", "w8", env=base)
    assert len(q3m_files(home / ".cache" / "q3moe")) == 1
    _, p = logits(tiny, work / "b.f32", "--quant", "w8", env=dict(base, XDG_CACHE_HOME=str(xdg)))
    assert "(first use)" in p.stderr and len(q3m_files(xdg / "q3moe")) == 1
    _, p = logits(tiny, work / "c.f32", "--quant", "w8", env=dict(base, XDG_CACHE_HOME=str(xdg),
                                                                   Q3MOE_CACHE_DIR=str(work / "c")))
    assert "(first use)" in p.stderr and len(q3m_files(work / "c")) == 1


def test_cache_bad_arguments(tiny, converted, work):
    env = cache_env(work / "cache")
    p = run(["logits", "-m", tiny, "--ids", "1", "-o", work / "o", "--quant", "w3a3"], env=env, check=False)
    assert p.returncode == 1 and "w3a3" in p.stderr and "w4a8" in p.stderr
    p = run(["logits", "-m", converted("w4a8"), "--ids", "1", "-o", work / "o", "--quant", "w8"], env=env,
            check=False)
    assert p.returncode == 1 and "already a .q3m" in p.stderr
    p = run(["generate", "-m", work / "nope", "--ids", "1", "--quant", "w8"], env=env, check=False)
    assert p.returncode == 1 and "nope" in p.stderr
    (work / "file").write_text("x")
    p = run(["logits", "-m", tiny, "--ids", "1", "-o", work / "o", "--quant", "w8"],
            env={"Q3MOE_CACHE_DIR": str(work / "file" / "sub")}, check=False)
    assert p.returncode == 1 and "cache" in p.stderr


# ------------------------------------------------- synth straight to .q3m

TINY_ARGS = ["--preset", "tiny", "--layers", "2"]


def synth_q3m(out, *extra, check=True, **kw):
    return run(["synth", "-o", out, *TINY_ARGS, *extra], check=check, **kw)


@pytest.mark.parametrize("scheme", ["w4a8", "w8", "bf16"])
def test_synth_q3m_is_synth_then_convert(work, scheme):
    """synth -o FILE.q3m writes the very bytes of synth -o DIR + convert (same
    seed, scheme, sharded source: tensor order survives the shard split)."""
    ffn, attn, act = SCHEMES[scheme]
    args = ["--vocab", "512", "--tokenizer", "none", "--seed", "7"]
    ck = synth(work / "ck", *args, "--shard-mb", "1")
    assert (ck / "model.safetensors.index.json").exists()
    via_dir = work / "via-dir.q3m"
    convert(ck, via_dir, scheme)
    direct = work / "direct.q3m"
    p = synth_q3m(direct, *args, "--ffn", ffn, "--attn", attn, "--act", act)
    assert "[synth] wrote" in p.stderr and str(direct) in p.stderr
    assert direct.read_bytes() == via_dir.read_bytes()
    assert sorted(os.listdir(work)) == ["ck", "direct.q3m", "via-dir.q3m"]


def test_synth_q3m_named_scheme_tokenizer_mixed(work):
    """--quant NAME, the embedded tokenizer, F32/F16/BF16 sources: still the same bytes."""
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        pytest.skip(f"no {TOKENIZER_DIR}/tokenizer.json (run make)")
    args = ["--hidden", "64", "--tie", "1", "--dtype", "mixed", "--tokenizer", TOKENIZER_DIR]
    ck = synth(work / "ck", *args)
    via_dir = work / "via-dir.q3m"
    convert(ck, via_dir, "w8a8")
    direct = work / "direct.q3m"
    synth_q3m(direct, *args, "--quant", "w8a8")
    raw = direct.read_bytes()
    assert raw == via_dir.read_bytes()
    _, secs, _ = parse_q3m(raw)
    assert list(secs) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    p = run(["generate", "-m", direct, "-p", "Hello", "-n", "3", "--temp", "0", "--print-ids"])
    assert len(json.loads(p.stdout.strip())) >= 1


def test_synth_q3m_default_scheme_and_dry_run(work):
    out = work / "m.q3m"
    p = synth_q3m(out, "--vocab", "512", "--tokenizer", "none", "--dry-run")
    plan = json.loads(p.stdout)
    assert not out.exists() and os.listdir(work) == []
    synth_q3m(out, "--vocab", "512", "--tokenizer", "none")
    hdr, _, tensors = parse_q3m(out.read_bytes())
    assert hdr["scheme"] == ("MXFP4", "MXFP8", 1)  # W4A8, as convert
    assert plan["file_bytes"] == out.stat().st_size and plan["tensors"] == len(tensors)


def test_synth_q3m_30b_dry_run(work):
    """The full 48-layer Qwen3-30B-A3B geometry in W4A8: about 17 GB instead of 61."""
    p = run(["synth", "-o", work / "q30b.q3m", "--preset", "qwen3-30b-a3b", "--tokenizer", "none", "--dry-run"])
    plan = json.loads(p.stdout)
    assert plan["tensors"] == 18867 and 60e9 < plan["total_bytes"] < 62e9
    assert 16e9 < plan["file_bytes"] < 18e9, plan
    assert os.listdir(work) == []


def test_synth_q3m_refuses_to_overwrite(work):
    out = work / "m.q3m"
    out.write_bytes(b"precious")
    p = synth_q3m(out, "--tokenizer", "none", check=False)
    assert p.returncode == 1 and "q3moe synth: error" in p.stderr
    assert str(out) in p.stderr and "--force" in p.stderr
    assert out.read_bytes() == b"precious"
    synth_q3m(out, "--tokenizer", "none", "--vocab", "512", "--force")
    assert out.read_bytes()[:8] == b"Q3MOE\0PK"
    assert os.listdir(work) == ["m.q3m"], "temporary file left behind"


def test_synth_q3m_unwritable_paths(work):
    missing = work / "no" / "such" / "dir" / "m.q3m"
    p = synth_q3m(missing, "--tokenizer", "none", check=False)
    assert p.returncode == 1 and str(missing) in p.stderr and "No such file or directory" in p.stderr
    d = work / "d.q3m"
    d.mkdir()
    p = synth_q3m(d, "--tokenizer", "none", check=False)
    assert p.returncode == 1 and str(d) in p.stderr and "is a directory" in p.stderr
    assert os.listdir(d) == []


def test_synth_q3m_failed_write_leaves_nothing(work):
    """A write error (a 1 MiB file size limit) removes the temporary file."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    out = work / "m.q3m"
    p = subprocess.run([Q3MOE, "synth", "-o", str(out), *TINY_ARGS, "--tokenizer", "none"],
                       capture_output=True, text=True, preexec_fn=limit)
    assert p.returncode == 1 and "q3moe synth: error" in p.stderr and "m.q3m" in p.stderr
    assert os.listdir(work) == []


@pytest.mark.parametrize("args, words", [
    (["--quant", "w3a3"], ["--quant", "w3a3", "w4a8"]),
    (["--quant"], ["--quant"]),
    (["--ffn", "int4"], ["--ffn", "int4", "mxfp4"]),
    (["--attn", "fp8"], ["--attn", "fp8", "mxfp8"]),
    (["--act", "mxfp4"], ["--act", "mxfp4", "none"]),
    (["--shard-mb", "64"], ["--shard-mb", ".q3m"]),
])
def test_synth_q3m_bad_arguments(work, args, words):
    out = work / "m.q3m"
    p = synth_q3m(out, "--tokenizer", "none", *args, check=False)
    assert p.returncode == 2, p.stderr
    assert "q3moe synth: error" in p.stderr or "q3moe: error" in p.stderr
    for w in words:
        assert w in p.stderr, f"{w!r} not in {p.stderr!r}"
    assert os.listdir(work) == []


def test_synth_scheme_needs_q3m_output(work):
    d = work / "dir"
    for args in (["--quant", "w4a8"], ["--ffn", "mxfp4"], ["--act", "none"]):
        p = run(["synth", "-o", d, *TINY_ARGS, "--tokenizer", "none", *args], check=False)
        assert p.returncode == 2 and args[0] in p.stderr and ".q3m" in p.stderr, p.stderr
    assert not d.exists()
    # a number after --ffn is still the dense intermediate size
    synth(d, "--vocab", "512", "--tokenizer", "none", "--ffn", "384", "--mlp-only-layers", "0")
    assert json.loads((d / "config.json").read_text())["intermediate_size"] == 384


def test_synth_q3m_progress_bar_on_a_terminal(work):
    import pty
    master, slave = pty.openpty()
    out = work / "m.q3m"
    p = subprocess.Popen([Q3MOE, "synth", "-o", str(out), *TINY_ARGS, "--vocab", "512", "--tokenizer", "none"],
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:  # EIO once the child closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    assert p.wait(timeout=TIMEOUT_S) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "\r[synth] [" in text and "100.0%" in text and "[synth] wrote" in text, text


def test_help_mentions_q3m_output():
    p = run(["synth", "--help"])
    for w in ("FILE.q3m", "--quant", "--attn", "--act", "w4a8"):
        assert w in p.stdout, w
    p = run(["convert", "--help"])
    assert "--quant" in p.stdout and "w8a8" in p.stdout
