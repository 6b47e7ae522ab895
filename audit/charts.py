"""Small server-side SVG charts for the audit report (pure Python; no JS, no network).

Every function returns a standalone ``<svg>`` string (escaped text, ``role="img"`` and
a ``<title>`` per bar for tooltips) that a template can inline.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

PALETTE: tuple[str, ...] = ("#2457c5", "#e08a1e", "#1f7a4d", "#8e44ad", "#b83232")
FONT = 'font-family="system-ui, sans-serif" font-size="12"'
SMALL = 'font-family="system-ui, sans-serif" font-size="10"'


def _fmt(value: float | None, digits: int = 3) -> str:
    return "undefined" if value is None else f"{value:.{digits}f}"


def _legend(series: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for n, name in enumerate(series):
        cx = x + n * 150
        out.append(f'<rect x="{cx}" y="{y - 10}" width="12" height="12" fill="{PALETTE[n % len(PALETTE)]}"/>')
        out.append(f'<text x="{cx + 17}" y="{y}" {FONT}>{escape(name)}</text>')
    return out


def grouped_hbar_svg(
    rows: Sequence[str],
    series: Sequence[str],
    values: Mapping[tuple[str, str], float | None],
    title: str,
    lo: float = -1.0,
    hi: float = 1.0,
    width: int = 720,
) -> str:
    """Horizontal grouped bars: one group per row (e.g. retriever), one bar per series.

    Values are drawn from 0 on an axis clipped to ``[lo, hi]`` (a clipped bar ends in a
    notch and its label shows the exact value); ``None`` is written "undefined".
    """
    label_w, pad, bar_h, gap = 230, 12, 14, 10
    value_w = 110  # a column of exact values on the right
    plot_w = width - label_w - value_w - 10
    n_series = max(1, len(series))
    group_h = n_series * bar_h + gap
    height = 46 + len(rows) * group_h + 28
    lo = min(lo, 0.0)
    hi = max(hi, 0.0) if hi > lo else lo + 1.0

    def x_of(v: float) -> float:
        v = min(max(v, lo), hi)
        return label_w + (v - lo) / (hi - lo) * plot_w

    zero = x_of(0.0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}">',
        f'<title>{escape(title)}</title>',
        f'<text x="{pad}" y="18" {FONT} font-weight="600">{escape(title)}</text>',
        *_legend(series, label_w, 36),
    ]
    top = 46
    for tick in sorted({lo, 0.0, hi, *(t / 2 for t in range(int(lo * 2), int(hi * 2) + 1))}):
        tx = x_of(tick)
        out.append(f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{height - 24}" stroke="#d9e2ec"/>')
        out.append(f'<text x="{tx:.1f}" y="{height - 10}" {FONT} text-anchor="middle" fill="#616e7c">{round(tick, 2):g}</text>')
    out.append(f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{height - 24}" stroke="#616e7c"/>')
    for r, row in enumerate(rows):
        y0 = top + r * group_h
        out.append(f'<text x="{label_w - 8}" y="{y0 + n_series * bar_h / 2 + 4:.1f}" {FONT} text-anchor="end">'
                   f'{escape(row if len(row) <= 34 else row[:33] + "…")}</text>')
        for s, name in enumerate(series):
            v = values.get((row, name))
            y = y0 + s * bar_h
            colour = PALETTE[s % len(PALETTE)]
            tip = f"{row} · {name}: {_fmt(v)}"
            value_x = label_w + plot_w + 10
            if v is None:
                out.append(f'<text x="{value_x}" y="{y + bar_h - 3}" {FONT} fill="#616e7c">'
                           f'<title>{escape(tip)}</title>undefined</text>')
                continue
            x1, x2 = sorted((zero, x_of(v)))
            clipped = v < lo or v > hi
            faded = ' opacity="0.6"' if clipped else ""
            out.append(f'<rect x="{x1:.1f}" y="{y + 1}" width="{max(x2 - x1, 1):.1f}" height="{bar_h - 2}" '
                       f'fill="{colour}"{faded}><title>{escape(tip)}</title></rect>')
            out.append(f'<text x="{value_x}" y="{y + bar_h - 3}" {FONT} fill="{colour}">'
                       f'{_fmt(v)}{" (clipped)" if clipped else ""}</text>')
    out.append("</svg>")
    return "".join(out)


def histogram_svg(
    histograms: Mapping[str, Mapping[int, int]],
    n_max: int,
    title: str,
    width: int = 720,
    height: int = 260,
) -> str:
    """Vertical grouped bars: x = number of retrievers (0..n_max), one bar per series."""
    series = list(histograms)
    pad_l, pad_b, pad_t = 48, 40, 62
    plot_w, plot_h = width - pad_l - 16, height - pad_b - pad_t
    xs = list(range(0, max(n_max, 0) + 1))
    peak = max([c for h in histograms.values() for c in h.values()] + [1])
    group_w = plot_w / len(xs)
    bar_w = max(2.0, (group_w - 8) / max(1, len(series)))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}">',
        f'<title>{escape(title)}</title>',
        f'<text x="8" y="18" {FONT} font-weight="600">{escape(title)}</text>',
        *_legend(series, pad_l, 36),
    ]
    base = pad_t + plot_h
    out.append(f'<line x1="{pad_l}" y1="{base}" x2="{width - 16}" y2="{base}" stroke="#616e7c"/>')
    for tick in (0, peak / 2, peak):
        y = base - tick / peak * plot_h
        out.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{width - 16}" y2="{y:.1f}" stroke="#eef2f6"/>')
        out.append(f'<text x="{pad_l - 6}" y="{y + 4:.1f}" {FONT} text-anchor="end" fill="#616e7c">{tick:.0f}</text>')
    for i, x in enumerate(xs):
        gx = pad_l + i * group_w + 4
        out.append(f'<text x="{gx + (group_w - 8) / 2:.1f}" y="{base + 16}" {FONT} text-anchor="middle">{x}</text>')
        for s, name in enumerate(series):
            count = int(histograms[name].get(x, 0))
            h = count / peak * plot_h
            colour = PALETTE[s % len(PALETTE)]
            tip = f"{name}: {count} quer{'y' if count == 1 else 'ies'} solved by {x} retriever{'' if x == 1 else 's'}"
            out.append(f'<rect x="{gx + s * bar_w:.1f}" y="{base - h:.1f}" width="{bar_w - 1:.1f}" '
                       f'height="{h:.1f}" fill="{colour}"><title>{escape(tip)}</title></rect>')
            if count:
                out.append(f'<text x="{gx + s * bar_w + (bar_w - 1) / 2:.1f}" y="{base - h - 3:.1f}" {SMALL} '
                           f'text-anchor="middle">{count}</text>')
    out.append(f'<text x="{pad_l + plot_w / 2:.1f}" y="{height - 6}" {FONT} text-anchor="middle" fill="#616e7c">'
               f'retrievers within K</text>')
    out.append("</svg>")
    return "".join(out)
