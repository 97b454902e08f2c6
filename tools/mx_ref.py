#!/usr/bin/python3
"""Reference OCP Microscaling (MX v1.0) quantization in numpy.

Written from the format description alone, independently of src/quant, so
tests/test_mx_reference.py can compare the two bit for bit. The method differs
on purpose: float elements are rounded by searching a table of every
representable magnitude rather than by exponent/mantissa arithmetic; INT8
elements by np.rint (round half to even) in float64, where every step is exact.

Blocks of 32 consecutive values along the last axis share an E8M0 scale
2^(code - 127). For a block with largest magnitude amax:
    shared = floor(log2(amax)) - emax
        (emax: 8 for FP8 E4M3, 2 for FP4 E2M1, 0 for INT8)
    clamped to [-127, 127]; an all-zero block gets -127 (scale code 0).
MXFP8 / MXFP4: element = value / 2^shared rounded to the nearest representable
    value, ties to the even code, saturating at +-448 / +-6; the sign of zero
    is kept.
MXINT8: element = two's-complement int8 k standing for k / 64 (implicit scale
    2^-6), k = value / 2^shared * 64 rounded to the nearest integer, ties to
    even, clamped to [-127, 127] (symmetric: -128 is never produced, though
    code 0x80 decodes to -2); zero of either sign is code 0, i.e. +0.
Inputs are taken as float32 (what the engine holds); NaN or infinity, or a
last axis that is not a multiple of 32, raise ValueError.

Layouts match the engine: scales [..., n/32] uint8; MXFP8 and MXINT8 codes
[..., n] uint8 (MXINT8: the int8 bit pattern); MXFP4 codes packed two per byte
[..., n/2], element 2i in the low nibble.

fake_quant_mxfp8(x) / fake_quant_mxfp4(x) / fake_quant_mxint8(x) quantize and
dequantize, returning float32 of x's shape: what a tensor looks like after
passing through MX.
"""
import numpy as np

BLOCK = 32


def _magnitudes(exp_bits, man_bits, bias, nan_top_code):
    """Non-negative values of a sign-magnitude minifloat, indexed by code.

    Exponent field 0 holds subnormals: m / 2^man_bits * 2^(1 - bias). Field f
    > 0: (1 + m / 2^man_bits) * 2^(f - bias). If nan_top_code, the all-ones
    code is NaN and is left out (E4M3 has no infinities, only that NaN)."""
    vals = []
    for code in range(1 << (exp_bits + man_bits)):
        f, m = code >> man_bits, code & ((1 << man_bits) - 1)
        frac = m / (1 << man_bits)
        vals.append(frac * 2.0 ** (1 - bias) if f == 0 else (1 + frac) * 2.0 ** (f - bias))
    if nan_top_code:
        vals.pop()
    return np.array(vals, dtype=np.float64)


class _Format:
    def __init__(self, name, exp_bits, man_bits, bias, nan_top_code, emax):
        self.name = name
        self.grid = _magnitudes(exp_bits, man_bits, bias, nan_top_code)  # ascending in code
        self.sign_bit = 1 << (exp_bits + man_bits)
        self.emax = emax
        # decode table over every code, sign included (NaN where it is NaN)
        mags = np.full(self.sign_bit, np.nan)
        mags[: len(self.grid)] = self.grid
        self.decode = np.concatenate([mags, -mags])

    def round(self, a):
        """Codes (without sign) of the nearest grid values to a >= 0 (float64)."""
        g = self.grid
        a = np.minimum(a, g[-1])  # saturate: beyond the top the top is nearest anyway
        hi = np.clip(np.searchsorted(g, a, side="left"), 1, len(g) - 1)  # g[hi-1] <= a <= g[hi] (a > 0)
        lo = hi - 1
        d_lo, d_hi = a - g[lo], g[hi] - a
        pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
        return np.where(pick_hi, hi, lo).astype(np.uint8)


E4M3 = _Format("E4M3", 4, 3, 7, True, 8)
E2M1 = _Format("E2M1", 2, 1, 1, False, 2)


class _Int8:
    """The MX INT8 element: two's-complement int8 k worth k / 64."""
    name = "INT8"
    emax = 0  # the largest magnitude, 127/64, is in the binade [1, 2)
    grid = np.arange(128) / 64.0  # magnitudes the quantizer produces, ascending
    decode = np.arange(256, dtype=np.uint8).view(np.int8) / 64.0  # by code; 0x80 -> -2


INT8 = _Int8()


def _blocks(x):
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"last axis of shape {x.shape} is not a multiple of the block size {BLOCK}")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ValueError(f"element {bad[0]} (flat index) is {x.reshape(-1)[bad[0]]}, not finite")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK))


def _shared_exponents(xb, emax):
    """Shared exponent of each block of xb [..., blocks, 32] (float64), as int."""
    amax = np.abs(xb).max(axis=-1)
    _, e = np.frexp(amax)  # amax = m * 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    shared = np.clip(e - 1 - emax, -127, 127)
    return np.where(amax == 0, -127, shared)


def _quantize(x, fmt):
    """(scale codes [..., n/32], element codes [..., n]) with sign bits."""
    xb = _blocks(x).astype(np.float64)  # float32 -> float64 is exact, and so is every step below
    shared = _shared_exponents(xb, fmt.emax)
    scaled = np.ldexp(xb, -shared[..., None])  # float64 has the range to hold this exactly
    codes = fmt.round(np.abs(scaled))
    codes = np.where(np.signbit(scaled), codes | fmt.sign_bit, codes).astype(np.uint8)
    return (shared + 127).astype(np.uint8), codes.reshape(np.shape(x))


def quantize_mxfp8(x):
    return _quantize(x, E4M3)


def quantize_mxfp4(x):
    scales, codes = _quantize(x, E2M1)
    return scales, pack_fp4(codes)


def quantize_mxint8(x):
    xb = _blocks(x).astype(np.float64)
    shared = _shared_exponents(xb, INT8.emax)
    # value / 2^shared * 64 is exact in float64 (24 significant bits, magnitude within
    # [2^-270, 2^261]), so np.rint rounds the true quotient: half to even, as the format asks
    k = np.clip(np.rint(np.ldexp(xb, 6 - shared[..., None])), -127, 127)
    codes = k.astype(np.int8).view(np.uint8)  # -0.0 becomes integer 0: no negative zero
    return (shared + 127).astype(np.uint8), codes.reshape(np.shape(x))


def pack_fp4(codes):
    """[..., n] 4-bit codes -> [..., n/2] bytes, element 2i in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed):
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def e8m0_to_float(scales):
    s = np.asarray(scales, dtype=np.int64)
    return np.where(s == 255, np.nan, np.ldexp(1.0, s - 127))


def dequantize(fmt, scales, codes):
    """fmt "mxfp8", "mxfp4" (codes packed as quantize_mxfp4 returns them) or "mxint8" -> float32."""
    if fmt == "mxfp4":
        f, codes = E2M1, unpack_fp4(codes)
    elif fmt in ("mxfp8", "mxint8"):
        f, codes = (E4M3 if fmt == "mxfp8" else INT8), np.asarray(codes, dtype=np.uint8)
    else:
        raise ValueError(f"unknown MX format {fmt!r}")
    vals = f.decode[codes].reshape(codes.shape[:-1] + (-1, BLOCK))
    # the float64 product is exact and fits float32 except where it overflows, which only
    # scales quantization never makes (or code 0x80 of MXINT8 under scale 2^127) can: inf
    with np.errstate(over="ignore"):
        out = (vals * e8m0_to_float(scales)[..., None]).astype(np.float32)
    return out.reshape(codes.shape)


def fake_quant_mxfp8(x):
    return dequantize("mxfp8", *quantize_mxfp8(x))


def fake_quant_mxfp4(x):
    return dequantize("mxfp4", *quantize_mxfp4(x))


def fake_quant_mxint8(x):
    return dequantize("mxint8", *quantize_mxint8(x))
