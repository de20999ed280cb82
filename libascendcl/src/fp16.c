/*
 * fp16.c: aclFloat16 (IEEE binary16 bits) to float and back, host-side, bit for bit as CANN.
 *
 * Finite values convert as IEEE binary16 does, rounding to nearest, ties to even (subnormals
 * included). What CANN's header documents beyond IEEE is kept: it has no Inf or NaN in either
 * direction. float to half saturates: a magnitude that rounds past 65504, an infinity and a NaN
 * all become +/-65504 (0x7BFF / 0xFBFF); half to float reads exponent 31 as an ordinary
 * exponent, so 0x7C00 (+Inf in IEEE) is 65536.0, 0xFC00 is -65536.0 and 0x7E00 is 98304.0.
 */
#include "client.h"

#include <string.h>

#define F16_MAX_FINITE 0x7BFFu

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shift v right by n bits, rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint64_t v, unsigned n)
{
    uint64_t kept = v >> n, rest = v & ((UINT64_C(1) << n) - 1), half = UINT64_C(1) << (n - 1);
    if (rest > half || (rest == half && (kept & 1)))
        kept++;
    return (uint32_t)kept;
}

API float aclFloat16ToFloat(aclFloat16 value)
{
    uint32_t sign = (uint32_t)(value & 0x8000u) << 16, man = value & 0x3FFu;
    int exp = (value >> 10) & 0x1F;
    if (exp == 0) {
        if (man == 0)
            return bits_float(sign);
        exp = 1; /* a subnormal: normalise the mantissa */
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        man &= 0x3FFu;
    }
    return bits_float(sign | ((uint32_t)(exp + 127 - 15) << 23) | (man << 13)); /* exponent 31 included */
}

API aclFloat16 aclFloatToFloat16(float value)
{
    uint32_t u = float_bits(value);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xFFu, man = u & 0x7FFFFFu;
    if (exp > 127 + 15) /* 2^16 and beyond, Inf and NaN */
        return (aclFloat16)(sign | F16_MAX_FINITE);
    if (exp <= 127 - 15) { /* a half subnormal (or zero): units of 2^-24 */
        if (exp < 127 - 25) /* below half the smallest subnormal: zero */
            return sign;
        /* the value is (1.man) * 2^(exp - 127) = (man | 2^23) * 2^(exp - 126) units */
        uint32_t m = shift_round_even((uint64_t)(man | 0x800000u), 126 - exp);
        return (aclFloat16)(sign | m); /* m == 0x400 is the smallest normal: the bits are the same */
    }
    uint32_t h = ((exp - (127 - 15)) << 10) + shift_round_even(man, 13); /* a carry bumps the exponent */
    if (h > F16_MAX_FINITE)
        h = F16_MAX_FINITE;
    return (aclFloat16)(sign | h);
}
