"""``math.Pow`` and ``math.Log`` as Determined's master computes them: Go's, on amd64.

Why: a ``log`` hyperparameter is ``Pow(base, Uniform(minval, maxval))`` in Determined's master
(``master/pkg/searcher/hyperparameters.go``), and its ASHA brackets come from ``Log(n) /
Log(divisor)``. Python's ``math.pow`` and ``math.log`` are the C library's; Go's are its own
algorithms, and the two disagree in the last bits of a quarter to a half of ``log`` draws. A
search promising Determined's trials for Determined's seed must compute as Go does.

What runs in Go on amd64 (Go 1.19 to today): ``Pow`` is Go code (repeated squaring for the
integer part of the exponent, ``Exp(frac * Log(x))`` for the rest); ``Log`` is assembly doing
FreeBSD's ``log`` step by step; ``Exp`` is assembly of Shibata's method (a Taylor series of the
argument divided by 16, squared back four times), which uses fused multiply-adds where the CPU
has AVX and FMA (every x86 server since 2013) and separate multiplies and adds where it has not.
Each function below does the same floating-point operations in the same order; a fused
multiply-add is rounded once, as the instruction does. ``tests/test_search_rules.py`` compares
them bit for bit with a Go program where Go is installed.
"""
from __future__ import annotations

import math
import struct
from fractions import Fraction
from typing import Iterable

#: Whether ``exp`` follows Go's fused multiply-add path (a master on a CPU with AVX and FMA).
MASTER_HAS_FMA = True

_LOG2E = 1.4426950408889634073599246810018920
_LN2_HIGH = 0.69314718055966295651160180568695068359375
_LN2_LOW = 0.28235290563031577122588448175013436025525412068e-12
_EXP_OVERFLOW = 7.09782712893384e02
#: 1/k! for k = 8 down to 2, then 1: the Taylor series of exp(r) - 1 in Horner's order.
_EXP_TAYLOR = (2.4801587301587301587e-5, 1.9841269841269841270e-4, 1.3888888888888888889e-3,
               8.3333333333333333333e-3, 4.1666666666666666667e-2, 1.6666666666666666667e-1,
               0.5, 1.0)

#: Go's ``math.NaN()``: a quiet NaN with payload 1.
GO_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]

_HALF_SQRT2 = 7.07106781186547524401e-01
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG_ODD = (6.666666666666735130e-01, 2.857142874366239149e-01, 1.818357216161805012e-01,
            1.479819860511658591e-01)  # L1, L3, L5, L7
_LOG_EVEN = (3.999999999940941908e-01, 2.222219843214978396e-01, 1.531383769920937332e-01)  # L2, L4, L6


def fused_multiply_add(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once (the FMA instruction; Python 3.11 has no ``math.fma``)."""
    if not all(map(math.isfinite, (a, b, c))):
        return a * b + c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # the sign of a zero, as the hardware gives it
    return float(exact)


def _nearest_int32(value: float) -> int:
    """CVTSD2SL: round to nearest, ties to even; out of range gives the "integer indefinite"."""
    if not math.isfinite(value) or abs(value) >= 2.0**31:
        return -(2**31)
    return round(value)


def exp(x: float) -> float:
    """Go's ``math.Exp`` on amd64 (``exp_amd64.s``)."""
    if math.isnan(x) or x == math.inf:
        return x
    if x == -math.inf:
        return 0.0
    if x > _EXP_OVERFLOW:
        return math.inf
    exponent = _nearest_int32(_LOG2E * x)
    k = float(exponent)
    fma = MASTER_HAS_FMA
    if fma:
        r = fused_multiply_add(-_LN2_HIGH, k, x)
        r = fused_multiply_add(-_LN2_LOW, k, r)
    else:
        r = x - _LN2_HIGH * k
        r = r - _LN2_LOW * k
    r *= 0.0625
    series = _EXP_TAYLOR[0]
    for coefficient in _EXP_TAYLOR[1:]:
        series = fused_multiply_add(series, r, coefficient) if fma else series * r + coefficient
    value = r * series  # exp(r) - 1; squared back: (e^r - 1)(e^r + 1) = e^2r - 1, four times
    for squaring in range(4):
        if fma and squaring == 3:
            value = fused_multiply_add(value, value + 2.0, 1.0)
        else:
            value = value * (value + 2.0)
    if not fma:
        value = value + 1.0
    return _times_power_of_two(value, exponent)


def _times_power_of_two(value: float, exponent: int) -> float:
    """The end of ``exp_amd64.s``: ``value * 2**exponent`` built from the exponent's bits."""
    biased = exponent + 0x3FF
    if biased <= 0:
        if biased < -52:
            return 0.0
        return (value * math.ldexp(1.0, biased + 0x3FE - 0x3FF)) * math.ldexp(1.0, 1 - 0x3FF)
    if biased >= 0x7FF:
        return math.inf
    return value * math.ldexp(1.0, exponent)


def log(x: float) -> float:
    """Go's ``math.Log`` on amd64 (``log_amd64.s``: FreeBSD's ``log``, operation by operation)."""
    if x == 0:
        return -math.inf
    if math.isnan(x):
        return x
    if x < 0:
        return GO_NAN
    if x == math.inf:
        return x
    bits = _float_bits(x)
    f1 = _float_from_bits((bits & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000)
    k = float(((bits >> 52) & 0x7FF) - 0x3FE)
    if not _HALF_SQRT2 < f1:
        k -= 1.0
        f1 *= 2.0
    f = f1 - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    odd = _LOG_ODD[3]
    for coefficient in reversed(_LOG_ODD[:3]):
        odd = odd * s4 + coefficient
    even = _LOG_EVEN[2]
    for coefficient in reversed(_LOG_EVEN[:2]):
        even = even * s4 + coefficient
    r = s2 * odd + s4 * even
    half_f_squared = 0.5 * f * f
    return k * _LN2_HI - ((half_f_squared - (s * (half_f_squared + r) + k * _LN2_LO)) - f)


def pow(x: float, y: float) -> float:  # noqa: A001 - Go's name, on purpose
    """Go's ``math.Pow`` (``pow.go``; Go code on amd64, calling :func:`exp` and :func:`log`)."""
    special = _pow_special_case(x, y)
    if special is not None:
        return special
    y_fraction, y_integer = math.modf(abs(y))
    if y_fraction != 0 and x < 0:
        return GO_NAN
    if y_integer >= 2.0**63:
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    mantissa, exponent = 1.0, 0
    if y_fraction != 0:
        if y_fraction > 0.5:
            y_fraction -= 1.0
            y_integer += 1.0
        mantissa = exp(y_fraction * log(x))
    x_mantissa, x_exponent = math.frexp(x)
    remaining = int(y_integer)
    while remaining != 0:
        if x_exponent < -(1 << 12) or (1 << 12) < x_exponent:
            exponent += x_exponent
            break
        if remaining & 1:
            mantissa *= x_mantissa
            exponent += x_exponent
        x_mantissa *= x_mantissa
        x_exponent <<= 1
        if x_mantissa < 0.5:
            x_mantissa += x_mantissa
            x_exponent -= 1
        remaining >>= 1
    if y < 0:
        mantissa, exponent = 1.0 / mantissa, -exponent
    return _go_ldexp(mantissa, exponent)


def _pow_special_case(x: float, y: float) -> "float | None":
    """The cases ``pow.go`` answers before computing (zeros, infinities, NaN, halves)."""
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if math.isnan(x) or math.isnan(y):
        return GO_NAN
    if x == 0:
        odd = _is_odd_integer(y)
        if y < 0:
            return math.copysign(math.inf, x) if odd else math.inf
        return x if odd else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    if math.isinf(x):
        if x < 0:
            return pow(1 / x, -y)
        return 0.0 if y < 0 else math.inf
    if y == 0.5:
        return math.sqrt(x)
    if y == -0.5:
        return 1 / math.sqrt(x)
    return None


def _is_odd_integer(value: float) -> bool:
    if abs(value) >= 2.0**53:
        return False
    fraction, integer = math.modf(value)
    return fraction == 0 and int(integer) & 1 == 1


def _go_ldexp(fraction: float, exponent: int) -> float:
    """Go's ``Ldexp``: exact for normal results; a denormal one is rounded once, as C's is."""
    if fraction == 0 or not math.isfinite(fraction):
        return fraction
    try:
        return math.ldexp(fraction, exponent)
    except OverflowError:
        return math.copysign(math.inf, fraction)


def _float_bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def _float_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def sum_in_order(values: Iterable[float]) -> float:
    """``total += value`` for each value in order, as a Go loop adds float64s: one rounding per
    addition. Python's ``sum()`` of floats is compensated from 3.12 on and can differ from this
    in the last bit, enough to move a trial between adaptive ASHA's brackets."""
    total = 0.0
    for value in values:
        total += value
    return total
