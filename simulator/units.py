"""The one place for unit constants and for parsing quantities written with units.

Spec files may give a quantity as a plain number in the SI unit named by the field
(`mem_bw_bytes_per_s: 3.35e12`) or as a string with a unit (`"3.35 TB/s"`, `"80 GiB"`,
`"989.4 TFLOP/s"`, `"1830 MHz"`, `"25 us"`). Decimal prefixes are powers of 1000, binary
prefixes (Ki, Mi, Gi, Ti) powers of 1024, as vendors and drivers use them.
"""

from __future__ import annotations

import re

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024.0
MiB = 1024.0**2
GiB = 1024.0**3
TiB = 1024.0**4
TFLOPS = 1e12
US = 1e-6
MS = 1e-3

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": KiB,
    "Mi": MiB,
    "Gi": GiB,
    "Ti": TiB,
}

# base unit spelling -> (dimension, factor to SI)
_BASE = {
    "B": ("bytes", 1.0),
    "B/s": ("bytes_per_s", 1.0),
    "FLOP/s": ("flops_per_s", 1.0),
    "FLOPS": ("flops_per_s", 1.0),
    "OP/s": ("flops_per_s", 1.0),
    "OPS": ("flops_per_s", 1.0),
    "Hz": ("hz", 1.0),
    "s": ("s", 1.0),
    "W": ("w", 1.0),
}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_QUANTITY = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+)\s*([^\s\d].*)?$")


class UnitError(ValueError):
    """A quantity string that cannot be parsed into the expected dimension."""


def parse_quantity(value: str | float | int, *, dimension: str) -> float:
    """Parse `value` into SI units of `dimension` (bytes, bytes_per_s, flops_per_s, hz, s, w).

    A bare number is taken to be in SI units already. Raises UnitError naming the problem.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UnitError(f"expected a number or a quantity string, got {value!r}")
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float
            raise UnitError(f"{value!r} is too large a quantity") from None
    match = _QUANTITY.match(value.replace(",", "").replace("_", ""))
    if not match:
        raise UnitError(f"cannot read {value!r} as a quantity (e.g. '80 GiB', '3.35 TB/s')")
    number, unit = float(match.group(1)), (match.group(2) or "").strip()
    if not unit:
        return number
    if dimension == "s" and unit in _TIME:
        return number * _TIME[unit]
    for base, (dim, factor) in _BASE.items():
        if unit.endswith(base) and unit[: -len(base)] in _PREFIX:
            if dim != dimension:
                raise UnitError(f"{value!r} is in {dim}, expected {dimension}")
            return number * _PREFIX[unit[: -len(base)]] * factor
    raise UnitError(f"unknown unit {unit!r} in {value!r}")


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. 1.5 GiB."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    """Human-readable duration with a unit that keeps 3 significant figures readable."""
    if t >= 1.0:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"
