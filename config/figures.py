"""How every page, chart and file writes a figure: a fixed number of decimals, a half rounded up.

Django's ``floatformat`` (the templates' filter) rounds a half up on the figure's decimal text
(0.0625 -> "0.063"); Python's ``format`` rounds the binary value to even (0.0625 -> "0.062").
Pages print with the first, so the charts, the leaderboard's CSV, JSON and LaTeX and any other
text a figure is written into use :func:`fixed` here, the same rule: one figure, one text.
Pure: no Django.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def fixed(value: float, digits: int = 3, signed: bool = False) -> str:
    """``value`` with ``digits`` decimals, a half rounded up (as ``floatformat``); ``signed``:
    a "+" before a figure >= 0 (a difference). A figure that rounds to zero is never "-0.0"."""
    exact = Decimal(repr(float(value)))
    if not exact.is_finite():
        return repr(float(value))
    rounded = exact.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if not rounded:
        rounded = abs(rounded)
    text = str(rounded)
    return "+" + text if signed and rounded >= 0 else text


def percent(share: float, digits: int = 1) -> str:
    """A share as a percentage with ``digits`` decimals and a "%" (0.1255 -> "12.6%"), by :func:`fixed`."""
    return f"{fixed(share * 100, digits)}%"
