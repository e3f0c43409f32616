"""Regexes for bounded JSON numbers (outlines-core ignores `minimum`/`maximum`, so we lower them).

Contract: every string a returned regex matches is a JSON number literal whose value lies within
the bounds. The regexes are exact for integers and a sound under-approximation for numbers: a
fractional part is offered only after an integer part `I` with the whole interval `[I, I + 1)` inside
the bounds, and exponents are never produced. `None` means the bounds admit no literal at all.
The regex dialect is the common subset of Python `re` and Rust `regex` (ASCII digits only).
"""

from __future__ import annotations

import math

_FRACTION = r"\.[0-9]+"


def _same_length_range(low: str, high: str) -> list[str]:
    """Alternatives matching exactly the digit strings in [low, high], both of the same length."""
    if low == high:
        return [low]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    if low[0] == high[0]:
        return [low[0] + rest for rest in _same_length_range(low[1:], high[1:])]
    tail_len = len(low) - 1
    parts: list[str] = []
    first = int(low[0])
    if low[1:] != "0" * tail_len:
        parts += [low[0] + rest for rest in _same_length_range(low[1:], "9" * tail_len)]
        first += 1
    last = int(high[0])
    high_parts: list[str] = []
    if high[1:] != "9" * tail_len:
        high_parts = [high[0] + rest for rest in _same_length_range("0" * tail_len, high[1:])]
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        parts.append(f"{digit}[0-9]{{{tail_len}}}")
    return parts + high_parts


def natural_range_regex(low: int, high: int | None) -> str:
    """A regex for the decimal literals (no leading zeros) of the integers in [low, high], low >= 0.

    `high=None` means unbounded above. Requires `high is None or low <= high`.
    """
    assert low >= 0 and (high is None or low <= high)
    parts: list[str] = []
    top = high if high is not None else 10 ** len(str(low)) - 1
    for num_digits in range(len(str(low)), len(str(top)) + 1):
        start = max(low, 10 ** (num_digits - 1) if num_digits > 1 else 0)
        end = min(top, 10**num_digits - 1)
        parts += _same_length_range(str(start), str(end))
    if high is None:
        parts.append(f"[1-9][0-9]{{{len(str(low))},}}")
    return "|".join(parts)


def integer_range_regex(low: int | None, high: int | None) -> str | None:
    """A regex for the JSON integer literals in [low, high] (None = unbounded); None if empty."""
    if low is not None and high is not None and low > high:
        return None
    parts: list[str] = []
    if high is None or high >= 0:
        parts.append(natural_range_regex(max(low, 0) if low is not None else 0, high))
    if low is None or low < 0:
        magnitude_low = 1 if high is None or high >= -1 else -high
        magnitude_high = None if low is None else -low
        parts.append(f"-(?:{natural_range_regex(magnitude_low, magnitude_high)})")
    return "|".join(f"(?:{part})" for part in parts)


def _int_bounds(
    minimum: float | None, maximum: float | None, exclusive_min: bool, exclusive_max: bool
) -> tuple[int | None, int | None]:
    """The tightest integer bounds implied by (possibly fractional, possibly exclusive) bounds."""
    low = None if minimum is None else (math.floor(minimum) + 1 if exclusive_min else math.ceil(minimum))
    high = None if maximum is None else (math.ceil(maximum) - 1 if exclusive_max else math.floor(maximum))
    return low, high


def _fraction_part_range(
    low: float | None, high: float | None, exclusive_low: bool
) -> tuple[int, int | None] | None:
    """Integer parts J >= 0 such that J + f (0 <= f < 1, f = 0 possible) always lies in the bounds.

    The low bound needs J itself inside (f may be 0); the high bound needs J + 1 <= high (f may
    approach 1), whichever kind the high bound is.
    """
    start = 0 if low is None else max(0, math.floor(low) + 1 if exclusive_low else math.ceil(low))
    end = None if high is None else math.floor(high) - 1
    if end is not None and start > end:
        return None
    return start, end


def _fraction_parts(sign: str, low: float | None, high: float | None, exclusive_low: bool) -> list[str]:
    """Fractional literals `<sign>J.ddd` whose magnitude J + f lies in the (mirrored) bounds.

    Besides the integer parts of `_fraction_part_range`, an exclusive integral low bound J admits
    `J.ddd` with a nonzero fraction (e.g. 0.5 in the open interval (0, 1)).
    """
    parts: list[str] = []
    whole_range = _fraction_part_range(low, high, exclusive_low)
    if whole_range is not None:
        parts.append(f"{sign}(?:{natural_range_regex(*whole_range)}){_FRACTION}")
    is_open_integral_low = exclusive_low and low is not None and low >= 0 and low == math.floor(low)
    if is_open_integral_low and (high is None or low + 1 <= high):
        parts.append(rf"{sign}{int(low)}\.[0-9]*[1-9][0-9]*")
    return parts


def bounded_number_regex(
    minimum: float | None,
    maximum: float | None,
    *,
    exclusive_min: bool = False,
    exclusive_max: bool = False,
    is_integer: bool = False,
) -> str | None:
    """A regex for JSON number (or integer) literals within the bounds; None if it admits none.

    Numbers are the union of: integer literals in range; `I.ddd` with a non-negative integer part;
    `-J.ddd` (value -(J + f)), whose bounds mirror the positive case (see `_fraction_parts`).
    """
    int_low, int_high = _int_bounds(minimum, maximum, exclusive_min, exclusive_max)
    parts: list[str] = []
    whole = integer_range_regex(int_low, int_high)
    if whole is not None:
        parts.append(whole)
    if not is_integer:
        parts += _fraction_parts("", minimum, maximum, exclusive_min)
        parts += _fraction_parts(
            "-", None if maximum is None else -maximum, None if minimum is None else -minimum, exclusive_max
        )
    if not parts:
        return None
    return "|".join(f"(?:{part})" for part in parts)
