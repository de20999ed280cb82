"""Kubernetes quantities: parse, format and canonicalise them as the Go round trip does."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_SUFFIX_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")


def parse_quantity(text: object) -> tuple[Fraction, str]:
    """Parse a Kubernetes quantity into (value, format) with format binary/decimal/exponent."""
    if not isinstance(text, str):
        raise ValueError(f"quantity must be a string, got {type(text).__name__}")
    m = _QUANTITY.match(text.strip())
    if not m or m.group(1) in ("", "+", "-", "."):
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _SUFFIX_BINARY:
        return number * _SUFFIX_BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:]), "exponent"
    return number * Fraction(10) ** _SUFFIX_DECIMAL[suffix], "decimal"


def format_quantity(value: Fraction, fmt: str = "decimal") -> str:
    """Canonical form, as the apiserver stores it (rounded up to 1n; 1024Mi -> 1Gi, 1000 -> 1k)."""
    nano = value * 10**9
    if nano.denominator != 1:
        nano = Fraction(-((-nano.numerator) // nano.denominator))  # ceil
    value = nano / 10**9
    if value == 0:
        return "0"
    if fmt == "binary" and value.denominator == 1 and abs(value) >= 1024:
        for suffix, mult in reversed(list(_SUFFIX_BINARY.items())):
            if value % mult == 0:
                return f"{int(value / mult)}{suffix}"
        return str(int(value))
    exponent = -9
    while exponent < 18 and (value / Fraction(10) ** (exponent + 3)).denominator == 1:
        exponent += 3
    mantissa = int(value / Fraction(10) ** exponent)
    if fmt == "exponent":
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    suffix = {v: k for k, v in _SUFFIX_DECIMAL.items()}[exponent]
    return f"{mantissa}{suffix}"


def canonical_quantity(text: object) -> str:
    value, fmt = parse_quantity(text)
    return format_quantity(value, fmt)
