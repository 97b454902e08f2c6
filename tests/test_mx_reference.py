"""The C MX quantizer (src/quant) against the numpy reference (tools/mx_ref.py),
bit for bit, on ~100k values chosen to hit every rounding path: all scales
from fp32 subnormals to FLT_MAX, zeros of both signs, exact ties and their
float neighbours, saturation, and raw random bit patterns. Formats: MXFP8,
MXFP4 and MXINT8.

The C side is built here into a shared object and called through ctypes."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import mx_ref  # noqa: E402

MXFP8, MXFP4, MXINT8 = 3, 4, 5  # q3_dtype values (src/kernels/dtype.h)
FMT = {MXFP8: ("mxfp8", mx_ref.E4M3), MXFP4: ("mxfp4", mx_ref.E2M1), MXINT8: ("mxint8", mx_ref.INT8)}
TYPES = pytest.mark.parametrize("t", list(FMT), ids=[FMT[t][0] for t in FMT])  # -k mxint8 picks one


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mx") / "libmx.so")
    quant = os.path.join(ROOT, "src", "quant")
    srcs = [os.path.join(quant, f) for f in ("minifloat.c", "mx.c")]
    srcs.append(os.path.join(ROOT, "src", "util", "error.c"))
    cmd = [os.environ.get("CC", "cc"), "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
           "-shared", "-fPIC", "-I" + os.path.join(ROOT, "src"), "-o", out] + srcs + ["-lm"]
    subprocess.run(cmd, check=True)
    so = ctypes.CDLL(out)
    f32p, u8p, sz = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t
    so.q3_mx_quantize_row.argtypes = [ctypes.c_int, f32p, sz, u8p, u8p]
    so.q3_mx_quantize_row.restype = ctypes.c_int
    so.q3_mx_dequantize_row.argtypes = [ctypes.c_int, u8p, u8p, sz, f32p]
    so.q3_mx_dequantize_row.restype = None
    so.q3_mx_fake_quant_row.argtypes = [ctypes.c_int, f32p, sz, f32p]
    so.q3_mx_fake_quant_row.restype = ctypes.c_int
    so.q3_errmsg.restype = ctypes.c_char_p
    return so


def ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def c_quantize(lib, t, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.size
    scales = np.zeros(n // 32, np.uint8)
    elems = np.zeros(n // 2 if t == MXFP4 else n, np.uint8)
    rc = lib.q3_mx_quantize_row(t, ptr(x, ctypes.c_float), n, ptr(scales, ctypes.c_uint8),
                                ptr(elems, ctypes.c_uint8))
    return rc, scales, elems


def c_dequantize(lib, t, scales, elems, n):
    y = np.zeros(n, np.float32)
    lib.q3_mx_dequantize_row(t, ptr(scales, ctypes.c_uint8), ptr(elems, ctypes.c_uint8), n, ptr(y, ctypes.c_float))
    return y


def c_fake_quant(lib, t, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.zeros_like(x)
    assert lib.q3_mx_fake_quant_row(t, ptr(x, ctypes.c_float), x.size, ptr(y, ctypes.c_float)) == 0
    return y


def tie_blocks(rng, fmt, count):
    """Blocks whose max sits at the bottom of the top binade (so the shared
    exponent is k - emax) and whose other entries are midpoints between
    neighbouring representable values, or one float32 ulp either side."""
    g = fmt.grid
    mids = (g[:-1] + g[1:]) / 2
    out = np.empty((count, 32), np.float32)
    for b in range(count):
        k = int(rng.integers(-126, 126))
        scale = 2.0 ** (k - fmt.emax)
        vals = np.ldexp(rng.choice(mids, 31), k - fmt.emax).astype(np.float32)  # exact in float32 here
        nudge = rng.integers(-1, 2, 31)
        vals = np.where(nudge < 0, np.nextafter(vals, np.float32(0)),
                        np.where(nudge > 0, np.nextafter(vals, np.float32(np.inf)), vals))
        vals *= rng.choice([-1, 1], 31).astype(np.float32)
        out[b, 0] = np.float32(2.0 ** fmt.emax * scale) * rng.choice([-1, 1])
        out[b, 1:] = vals
        rng.shuffle(out[b])
    return out.reshape(-1)


def saturation_blocks(rng, fmt, count):
    """Blocks whose entries, scaled, lie between the largest element value and
    2^(emax+1) (so all saturate or round down to the top), at the midpoint of
    the two (the rounding boundary, and its float32 neighbours) and elsewhere."""
    top, limit = fmt.grid[-1], 2.0 ** (fmt.emax + 1)
    out = np.empty((count, 32), np.float32)
    for b in range(count):
        k = int(rng.integers(-126, 128))
        mid = np.float32(np.ldexp((top + limit) / 2, k - fmt.emax))  # exact: few significant bits
        vals = np.array([mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf)),
                         np.float32(np.ldexp(top, k - fmt.emax))], np.float32)
        with np.errstate(over="ignore"):  # k = 127: a value rounding up to 2^128 in float32 is inf
            more = np.ldexp(rng.uniform(top, limit, 28), k - fmt.emax).astype(np.float32)
        vals = np.concatenate([vals, np.where(np.isfinite(more), more, np.finfo(np.float32).max)])
        out[b] = vals * rng.choice([-1, 1], 32).astype(np.float32)
        rng.shuffle(out[b])
    return out.reshape(-1)


def varied_values(rng, fmt):
    parts = []
    # random mantissas, one magnitude per block, spanning all of fp32
    e = rng.integers(-160, 128, 600)
    m = rng.uniform(-1, 1, (600, 32)) * rng.choice([1, 2], (600, 1))
    with np.errstate(over="ignore"):
        v = np.ldexp(m, e[:, None]).astype(np.float32)
    parts.append(np.where(np.isfinite(v), v, np.float32(3.0e38)).reshape(-1))
    # magnitudes spread within a block too, so small entries hit subnormals and zero
    e = rng.integers(-100, 100, 600)
    parts.append(np.ldexp(rng.uniform(-1, 1, (600, 32)), e[:, None] - rng.integers(0, 40, (600, 32)))
                 .astype(np.float32).reshape(-1))
    # fp32 subnormal blocks
    sign = rng.integers(0, 2, (100, 32)).astype(np.uint32) << 31
    sub = rng.integers(0, 1 << 23, (100, 32)).astype(np.uint32) | sign
    parts.append(sub.view(np.float32).reshape(-1))
    # zero blocks (both signs) and sparse blocks
    z = np.zeros((100, 32), np.float32)
    z[::2] = -0.0
    z[50:, 5] = rng.uniform(-1, 1, 50)
    parts.append(z.reshape(-1))
    # huge values and saturating blocks (max scaled just below 2^(emax+1))
    h = np.full((60, 32), np.float32(np.finfo(np.float32).max)) * rng.choice([-1, 1], (60, 32)).astype(np.float32)
    h[20:40] = rng.uniform(1.5, 2.0, (20, 32)).astype(np.float32) * np.float32(2.0 ** 100)
    h[40:, 0] = np.float32(1.9375 * 2.0 ** 60)
    h[40:, 1:] = rng.uniform(-1, 1, (20, 31)).astype(np.float32) * np.float32(2.0 ** 61)
    parts.append(h.reshape(-1))
    parts.append(tie_blocks(rng, fmt, 1000))
    parts.append(saturation_blocks(rng, fmt, 100))
    # raw random bit patterns (every exponent), non-finite ones replaced
    raw = rng.integers(0, 1 << 32, 800 * 32, dtype=np.uint64).astype(np.uint32).view(np.float32)
    parts.append(np.where(np.isfinite(raw), raw, np.float32(1.0)))
    x = np.concatenate(parts).astype(np.float32)
    assert x.size % 32 == 0 and np.isfinite(x).all()
    return x


@TYPES
def test_quantize_matches_reference(lib, t):
    name, fmt = FMT[t]
    x = varied_values(np.random.default_rng(1234 + t), fmt)
    assert x.size >= 100_000
    rc, scales, elems = c_quantize(lib, t, x)
    assert rc == 0, lib.q3_errmsg()
    ref_scales, ref_elems = getattr(mx_ref, "quantize_" + name)(x)
    bad = np.flatnonzero(scales != ref_scales)
    assert bad.size == 0, f"scale mismatch at blocks {bad[:5]}: C {scales[bad[:5]]} ref {ref_scales[bad[:5]]}"
    bad = np.flatnonzero(elems != ref_elems)
    assert bad.size == 0, f"element bytes differ at {bad[:5]}: C {elems[bad[:5]]} ref {ref_elems[bad[:5]]}"
    if t == MXINT8:  # symmetric saturation: -128 is decodable but never produced
        assert not (ref_elems == 0x80).any()

    y = c_dequantize(lib, t, scales, elems, x.size)
    ref_y = mx_ref.dequantize(name, ref_scales, ref_elems)
    assert np.array_equal(y.view(np.uint32), ref_y.view(np.uint32))
    fq = c_fake_quant(lib, t, x)
    assert np.array_equal(fq.view(np.uint32), ref_y.view(np.uint32))
    assert np.array_equal(getattr(mx_ref, "fake_quant_" + name)(x).view(np.uint32), ref_y.view(np.uint32))


@TYPES
def test_dequantize_every_code(lib, t):
    """Every element code under a spread of scale codes (NaN scale included)."""
    name, fmt = FMT[t]
    codes = np.arange(16 if t == MXFP4 else 256, dtype=np.uint8)
    codes = np.resize(codes, 32 * 64)
    elems = mx_ref.pack_fp4(codes) if t == MXFP4 else codes
    scales = np.array([0, 1, 2, 60, 100, 117, 119, 126, 127, 128, 140, 200, 240, 246, 252, 255] * 4, np.uint8)
    y = c_dequantize(lib, t, scales, elems, codes.size)
    with np.errstate(over="ignore"):
        ref = mx_ref.dequantize(name, scales, elems)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(y), nan)
    assert np.array_equal(y[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    if t == MXINT8:  # the decode table by hand: two's complement over 64; 0x80 is -2
        scale = np.repeat(np.ldexp(1.0, scales.astype(int) - 127), 32)
        k = codes.astype(np.int64)
        want = np.where(k >= 128, k - 256, k) / 64.0 * scale
        with np.errstate(over="ignore", invalid="ignore"):
            want = want.astype(np.float32)
        assert np.array_equal(ref[~nan].view(np.uint32), want[~nan].view(np.uint32))
        assert np.array_equal(np.isnan(ref), scales.repeat(32) == 255)
        y = c_dequantize(lib, t, np.array([0, 127, 200, 254], np.uint8), np.full(128, 0x80, np.uint8), 128)
        assert list(y[::32]) == [-2.0 ** -126, -2.0, -2.0 ** 74, -np.inf]  # -2^128 overflows float32


def test_hand_vectors():
    """The reference alone, on values worked out by hand."""
    x = np.zeros(32, np.float32)
    x[:4] = [3.0, -0.7, 0.3, 1.25]
    s, c = mx_ref.quantize_mxfp8(x)
    assert s[0] == 120 and list(c[:4]) == [0x7C, 0xEB, 0x62, 0x72]
    s, c = mx_ref.quantize_mxfp4(x)
    assert s[0] == 126 and list(c[:2]) == [0xB7, 0x41]
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] + [0.0] * 23 + [4.0], np.float32)
    assert list(mx_ref.fake_quant_mxfp4(ties)[:8]) == [0, 1, 1, 2, 2, 4, 4, 6]
    assert mx_ref.quantize_mxfp8(np.full(32, 1.5 * 2.0 ** -130, np.float32))[0][0] == 0
    assert mx_ref.quantize_mxfp4(np.full(32, 1.5 * 2.0 ** 127, np.float32))[0][0] == 252
    assert mx_ref.quantize_mxfp4(-np.zeros(32, np.float32))[1][0] == 0x88


def test_hand_vectors_mxint8():
    x = np.zeros(32, np.float32)
    x[:4] = [3.0, -0.7, 0.3, 1.25]  # shared 1: elements x * 32 -> 96, -22.4, 9.6, 40
    s, c = mx_ref.quantize_mxint8(x)
    assert s[0] == 128 and list(c[:5]) == [0x60, 0xEA, 0x0A, 0x28, 0x00]
    assert list(mx_ref.fake_quant_mxint8(x)[:4]) == [3.0, -0.6875, 0.3125, 1.25]
    # shared 0 (max 1.0): ties to even, saturation at 127/64 on both sides, zeros of both signs
    k = [0.5, 1.5, 2.5, -1.5, -0.5, 126.5, 127.5, -127.5, -127.25, 64]
    x = np.array([v / 64 for v in k] + [-0.0, 0.0] + [1.0] * 20, np.float32)
    s, c = mx_ref.quantize_mxint8(x)
    assert s[0] == 127
    assert list(c[:12].view(np.int8)) == [0, 2, 2, -2, 0, 126, 127, -127, -127, 64, 0, 0]
    assert not np.signbit(mx_ref.fake_quant_mxint8(x)[[0, 4, 10]]).any()  # no negative zero
    # scale extremes: FLT_MAX saturates under 2^127; below 2^-127 the scale stays 2^-127
    s, c = mx_ref.quantize_mxint8(np.full(32, -np.finfo(np.float32).max))
    assert s[0] == 254 and c[0] == 0x81
    s, c = mx_ref.quantize_mxint8(np.full(32, 1.5 * 2.0 ** -130, np.float32))  # 1.5 * 2^-3 * 64 = 12
    assert s[0] == 0 and c[0] == 12
    assert mx_ref.dequantize("mxint8", np.array([127], np.uint8), np.full(32, 0x80, np.uint8))[0] == -2.0


@TYPES
def test_errors_agree(lib, t):
    name = FMT[t][0]
    x = np.ones(64, np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        x[40] = bad
        rc, _, _ = c_quantize(lib, t, x)
        assert rc == -1 and b"element 40" in lib.q3_errmsg()
        with pytest.raises(ValueError):
            getattr(mx_ref, "quantize_" + name)(x)
    rc, _, _ = c_quantize(lib, t, np.ones(48, np.float32))
    assert rc == -1 and b"multiple" in lib.q3_errmsg()
    with pytest.raises(ValueError):
        getattr(mx_ref, "fake_quant_" + name)(np.ones(48, np.float32))
