"""Small server-side SVG charts (pure Python; no JS, no network): the audit report's bars,
histograms and line panels, and the agreement report's annotator heatmaps.

Every function returns a standalone ``<svg>`` string (escaped text, ``role="img"`` and
a ``<title>`` per bar for tooltips) that a template can inline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape

from config.figures import fixed

PALETTE: tuple[str, ...] = ("#2457c5", "#e08a1e", "#1f7a4d", "#8e44ad", "#b83232")
FONT = 'font-family="system-ui, sans-serif" font-size="12"'
SMALL = 'font-family="system-ui, sans-serif" font-size="10"'


def _fmt(value: float | None, digits: int = 3) -> str:
    """A figure as every page writes it (:func:`config.figures.fixed`), or "undefined"."""
    return "undefined" if value is None else fixed(value, digits)


def elided(text: str, max_chars: int) -> str:
    """``text`` cut in the middle to at most ``max_chars`` characters: a retriever spec keeps
    both its model (the start) and its checkpoint's file name (the end)."""
    if len(text) <= max_chars:
        return text
    head = (max_chars - 1) // 2
    return text[:head] + "…" + text[len(text) - (max_chars - 1 - head) :]


#: Width of one character of the charts' 12 px labels, a little generous (legend spacing).
CHAR_W = 7.0


def _legend_xs(names: Sequence[str], x: float, sample_w: float, least: float) -> list[float]:
    """Where each legend entry starts: after the one before it, its sample and its label (at
    least ``least`` apart), so that a long label never runs into the next entry's sample."""
    xs, cx = [], x
    for name in names:
        xs.append(cx)
        cx += max(least, sample_w + len(name) * CHAR_W + 18)
    return xs


def _legend(series: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for n, (name, cx) in enumerate(zip(series, _legend_xs(series, x, 17, 150))):
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
        f"<title>{escape(title)}</title>",
        f'<text x="{pad}" y="18" {FONT} font-weight="600">{escape(title)}</text>',
        *_legend(series, label_w, 36),
    ]
    top = 46
    for tick in sorted({lo, 0.0, hi, *(t / 2 for t in range(int(lo * 2), int(hi * 2) + 1))}):
        tx = x_of(tick)
        out.append(f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{height - 24}" stroke="#d9e2ec"/>')
        out.append(
            f'<text x="{tx:.1f}" y="{height - 10}" {FONT} text-anchor="middle" fill="#616e7c">{round(tick, 2):g}</text>'
        )
    out.append(f'<line x1="{zero:.1f}" y1="{top}" x2="{zero:.1f}" y2="{height - 24}" stroke="#616e7c"/>')
    for r, row in enumerate(rows):
        y0 = top + r * group_h
        # ~7 px a character at 12 px: the label fits between the left margin and the bars;
        # the whole name is the label's tooltip
        out.append(
            f'<text x="{label_w - 8}" y="{y0 + n_series * bar_h / 2 + 4:.1f}" {FONT} text-anchor="end">'
            f"<title>{escape(row)}</title>{escape(elided(row, (label_w - 8 - pad) // 7))}</text>"
        )
        for s, name in enumerate(series):
            v = values.get((row, name))
            y = y0 + s * bar_h
            colour = PALETTE[s % len(PALETTE)]
            tip = f"{row} · {name}: {_fmt(v)}"
            value_x = label_w + plot_w + 10
            if v is None:
                out.append(
                    f'<text x="{value_x}" y="{y + bar_h - 3}" {FONT} fill="#616e7c">'
                    f"<title>{escape(tip)}</title>undefined</text>"
                )
                continue
            x1, x2 = sorted((zero, x_of(v)))
            clipped = v < lo or v > hi
            faded = ' opacity="0.6"' if clipped else ""
            out.append(
                f'<rect x="{x1:.1f}" y="{y + 1}" width="{max(x2 - x1, 1):.1f}" height="{bar_h - 2}" '
                f'fill="{colour}"{faded}><title>{escape(tip)}</title></rect>'
            )
            out.append(
                f'<text x="{value_x}" y="{y + bar_h - 3}" {FONT} fill="{colour}">'
                f"{_fmt(v)}{' (clipped)' if clipped else ''}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _retriever_tip(name: str, count: int, x: int) -> str:
    return f"{name}: {count} quer{'y' if count == 1 else 'ies'} solved by {x} retriever{'' if x == 1 else 's'}"


def histogram_svg(
    histograms: Mapping[str, Mapping[int, int]],
    n_max: int,
    title: str,
    width: int = 720,
    height: int = 260,
    x_label: str = "retrievers within K",
    x_min: int = 0,
    tip: Callable[[str, int, int], str] = _retriever_tip,
) -> str:
    """Vertical grouped bars: x = ``x_min..n_max`` (by default retrievers within K), one bar per series.

    ``tip(series, count, x)`` is each bar's tooltip.
    """
    series = list(histograms)
    tip_of = tip
    pad_l, pad_b, pad_t = 48, 40, 62
    plot_w, plot_h = width - pad_l - 16, height - pad_b - pad_t
    xs = list(range(min(x_min, max(n_max, 0)), max(n_max, 0) + 1))
    peak = max([c for h in histograms.values() for c in h.values()] + [1])
    group_w = plot_w / len(xs)
    bar_w = max(2.0, (group_w - 8) / max(1, len(series)))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
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
            tip = tip_of(name, count, x)
            out.append(
                f'<rect x="{gx + s * bar_w:.1f}" y="{base - h:.1f}" width="{bar_w - 1:.1f}" '
                f'height="{h:.1f}" fill="{colour}"><title>{escape(tip)}</title></rect>'
            )
            if count:
                out.append(
                    f'<text x="{gx + s * bar_w + (bar_w - 1) / 2:.1f}" y="{base - h - 3:.1f}" {SMALL} '
                    f'text-anchor="middle">{count}</text>'
                )
    out.append(
        f'<text x="{pad_l + plot_w / 2:.1f}" y="{height - 6}" {FONT} text-anchor="middle" fill="#616e7c">'
        f"{escape(x_label)}</text>"
    )
    out.append("</svg>")
    return "".join(out)


#: Dash patterns and marker shapes that tell series apart besides their colour.
DASHES: tuple[str, ...] = ("", "7 4", "2 3")
MARKERS: tuple[str, ...] = ("circle", "square", "triangle")
#: Candidate tops of the y axis of :func:`line_panels_svg` (shares between 0 and 1).
Y_STEPS: tuple[float, ...] = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)


def _marker(shape: str, x: float, y: float, colour: str, tip: str) -> str:
    t = f"<title>{escape(tip)}</title>"
    if shape == "square":
        return f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" fill="{colour}">{t}</rect>'
    if shape == "triangle":
        pts = f"{x:.1f},{y - 4.5:.1f} {x - 4.5:.1f},{y + 3.5:.1f} {x + 4.5:.1f},{y + 3.5:.1f}"
        return f'<polygon points="{pts}" fill="{colour}">{t}</polygon>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}">{t}</circle>'


def _series_style(n: int) -> tuple[str, str]:
    """The colour and the stroke-dasharray attribute of the n-th series."""
    dash = DASHES[n % len(DASHES)]
    return PALETTE[n % len(PALETTE)], (f' stroke-dasharray="{dash}"' if dash else "")


def _line_legend(names: Sequence[str], pad_l: int) -> list[str]:
    """A line sample with its marker for each series."""
    out: list[str] = []
    for n, (name, lx) in enumerate(zip(names, _legend_xs(names, pad_l, 42, 170))):
        colour, dash_attr = _series_style(n)
        out.append(f'<line x1="{lx}" y1="36" x2="{lx + 34}" y2="36" stroke="{colour}" stroke-width="2.5"{dash_attr}/>')
        out.append(_marker(MARKERS[n % len(MARKERS)], lx + 17, 36, colour, name))
        out.append(f'<text x="{lx + 42}" y="40" {FONT}>{escape(name)}</text>')
    return out


def _panel_frame(
    panel_title: str,
    x0: float,
    panel_w: float,
    top: int,
    plot_h: int,
    height: int,
    top_v: float,
    y_of: Callable[[float], float],
    x_of: Callable[[int], float],
    x_labels: Sequence[str],
    x_label: str,
) -> list[str]:
    """A panel's title, box, horizontal grid with tick labels and x labels."""
    out = [
        f'<text x="{x0 + panel_w / 2:.1f}" y="{top - 10}" {FONT} font-weight="600" '
        f'text-anchor="middle">{escape(panel_title)}</text>',
        f'<rect x="{x0:.1f}" y="{top}" width="{panel_w:.1f}" height="{plot_h}" fill="none" stroke="#d9e2ec"/>',
    ]
    for j in range(5):
        tick = top_v * j / 4
        ty = y_of(tick)
        out.append(f'<line x1="{x0:.1f}" y1="{ty:.1f}" x2="{x0 + panel_w:.1f}" y2="{ty:.1f}" stroke="#e4e9ef"/>')
        out.append(
            f'<text x="{x0 - 5:.1f}" y="{ty + 4:.1f}" {SMALL} text-anchor="end" fill="#616e7c">'
            f"{round(tick, 4):g}</text>"
        )
    for i, lab in enumerate(x_labels):
        out.append(
            f'<text x="{x_of(i):.1f}" y="{top + plot_h + 15}" {SMALL} text-anchor="middle" '
            f'fill="#616e7c">{escape(str(lab))}</text>'
        )
    out.append(
        f'<text x="{x0 + panel_w / 2:.1f}" y="{height - 8}" {FONT} text-anchor="middle" '
        f'fill="#616e7c">{escape(x_label)}</text>'
    )
    return out


def _segments(points: Sequence[str | None]) -> list[list[str]]:
    """Runs of consecutive points; ``None`` is a gap."""
    segments: list[list[str]] = [[]]
    for p in points:
        if p is None:
            segments.append([])
        else:
            segments[-1].append(p)
    return [seg for seg in segments if seg]


def _panel_series(
    panel_title: str,
    series: Mapping[str, Sequence[float | None]],
    names: Sequence[str],
    n_x: int,
    y_of: Callable[[float], float],
    x_of: Callable[[int], float],
    x_labels: Sequence[str],
    x_label: str,
) -> list[str]:
    """A panel's polylines, then its markers; markers at the same point are spread
    horizontally by their series index."""
    seen: dict[tuple[int, float], int] = {}
    lines: list[str] = []
    marks: list[str] = []
    for n, name in enumerate(names):
        values = list(series.get(name, []))[:n_x]
        colour, dash_attr = _series_style(n)
        for i, v in enumerate(values):
            if v is None:
                continue
            key = (i, round(v, 6))
            nudge = seen.get(key, 0)
            seen[key] = nudge + 1
            marks.append(
                _marker(
                    MARKERS[n % len(MARKERS)],
                    x_of(i) + 5 * nudge,
                    y_of(v),
                    colour,
                    f"{panel_title} · {name} · {x_label} {x_labels[i]}: {_fmt(v)}",
                )
            )
        points = [None if v is None else f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(values)]
        for seg in _segments(points):
            if len(seg) > 1:
                lines.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{colour}" '
                    f'stroke-width="2.2"{dash_attr} stroke-linejoin="round"/>'
                )
    return lines + marks


def line_panels_svg(
    panels: Sequence[tuple[str, Mapping[str, Sequence[float | None]]]],
    x_labels: Sequence[str],
    title: str,
    x_label: str = "turn",
    y_label: str = "Hits@10",
    width: int = 960,
    height: int = 300,
    y_max: float | None = None,
    full_title: str | None = None,
) -> str:
    """Small multiples of line charts on a shared ``0..y_max`` axis: one panel per entry of ``panels``.

    ``title`` is drawn as the heading; ``full_title`` (default: the same) is the chart's
    tooltip and accessible name, for a heading that had to be shortened to fit.

    Each panel is ``(panel title, {series name: [y per x]})``; every panel has the same
    series (same colour, dash and marker per series, one legend on top). ``None``
    values are gaps. ``y_max`` defaults to the smallest of :data:`Y_STEPS` that holds
    every value (shares: at most 1), so that low curves are not flattened; the tick
    labels say the scale. Markers of series that coincide are nudged a few pixels
    apart so that every series stays visible; the lines themselves are exact.
    """
    names: list[str] = list(dict.fromkeys(n for _, series in panels for n in series))
    if y_max is None:
        peak = max([v for _, series in panels for vs in series.values() for v in vs if v is not None] + [0.0])
        y_max = next((y for y in Y_STEPS if peak <= y + 1e-12), 1.0)
    n_p = max(1, len(panels))
    pad_l, pad_r, top, pad_b, gutter = 58, 12, 70, 44, 42
    panel_w = (width - pad_l - pad_r - gutter * (n_p - 1)) / n_p
    plot_h = height - top - pad_b
    n_x = max(1, len(x_labels))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(full_title or title)}">',
        f"<title>{escape(full_title or title)}</title>",
        f'<text x="8" y="18" {FONT} font-weight="600">{escape(title)}</text>',
    ]
    out.extend(_line_legend(names, pad_l))
    top_v = float(y_max)

    def y_of(v: float) -> float:
        return top + (1 - min(max(v, 0.0), top_v) / top_v) * plot_h

    out.append(
        f'<text transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" {FONT} text-anchor="middle" '
        f'fill="#616e7c">{escape(y_label)}</text>'
    )
    for p, (panel_title, series) in enumerate(panels):
        x0 = pad_l + p * (panel_w + gutter)
        step = (panel_w - 24) / max(1, n_x - 1)

        def x_of(i: int, x0: float = x0, step: float = step) -> float:
            return x0 + 12 + (i * step if n_x > 1 else (panel_w - 24) / 2)

        out.extend(_panel_frame(panel_title, x0, panel_w, top, plot_h, height, top_v, y_of, x_of, x_labels, x_label))
        out.extend(_panel_series(panel_title, series, names, n_x, y_of, x_of, x_labels, x_label))
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------- heatmaps


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    t = min(1.0, max(0.0, t))
    r, g, bl = (round(x + (y - x) * t) for x, y in zip(a, b))
    return f"#{r:02x}{g:02x}{bl:02x}"


_WHITE = (255, 255, 255)
_BLUE = (36, 87, 197)
_RED = (184, 50, 50)


def cell_colour(value: float, vmin: float, vmax: float) -> tuple[str, bool]:
    """(fill, dark) for a value: white at 0 (or vmin when vmin >= 0), blue toward vmax, red
    toward a negative vmin. ``dark``: the fill needs white text."""
    if vmin < 0 <= vmax:
        t = value / vmax if value >= 0 else value / vmin
        return (_mix(_WHITE, _BLUE, t) if value >= 0 else _mix(_WHITE, _RED, t)), abs(t) > 0.55
    t = (value - vmin) / (vmax - vmin) if vmax > vmin else 1.0
    return _mix(_WHITE, _BLUE, t), t > 0.55


def heatmap_svg(
    labels: Sequence[str],
    values: Sequence[Sequence[float | None]],
    *,
    title: str,
    vmin: float,
    vmax: float,
    shared: Sequence[Sequence[int]] | None = None,
    element_id: str = "",
) -> str:
    """An annotator x annotator heatmap as inline SVG, the value printed in every cell.

    ``None`` cells (the diagonal, pairs without shared items, undefined coefficients) are
    grey with a dash. Labels are escaped; no script, no external resource.
    """
    n = len(labels)
    cell = 46 if n <= 12 else 34 if n <= 24 else 26
    font = 12 if n <= 12 else 10 if n <= 24 else 8
    label_w = 12 + 7 * max([len(str(x)) for x in labels] or [4])
    top = 18 + int(0.75 * label_w)
    legend_h = 44
    bar_w = max(160, min(320, n * cell))
    # rotated column labels lean right by about 0.7 of their length
    width = label_w + max(n * cell + int(0.72 * label_w), bar_w) + 16
    height = top + n * cell + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}"'
        + (f' id="{escape(element_id)}"' if element_id else "")
        + ">",
        f"<title>{escape(title)}</title>",
        f'<g font-family="system-ui, sans-serif" font-size="{font}">',
    ]
    for i, name in enumerate(labels):
        y = top + i * cell + cell / 2
        out.append(
            f'<text x="{label_w - 6}" y="{y:.1f}" text-anchor="end" dominant-baseline="middle" '
            f'fill="#1f2933">{escape(name)}</text>'
        )
        x = label_w + i * cell + cell / 2
        out.append(
            f'<text transform="translate({x:.1f},{top - 6}) rotate(-45)" text-anchor="start" '
            f'fill="#1f2933">{escape(name)}</text>'
        )
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            x, y = label_w + j * cell, top + i * cell
            if value is None:
                fill, dark, text = "#eef1f5", False, "–"
            else:
                fill, dark = cell_colour(float(value), vmin, vmax)
                text = _fmt(value, 2)
            tip = f"{labels[i]} × {labels[j]}: {_fmt(value, 4)}"
            if shared is not None and i != j:
                tip += f" ({shared[i][j]} shared items)"
            out.append(
                f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{fill}" stroke="#ffffff" stroke-width="1"/>'
                f'<text x="{x + cell / 2:.1f}" y="{y + cell / 2:.1f}" text-anchor="middle" '
                f'dominant-baseline="middle" fill="{"#ffffff" if dark else "#1f2933"}">{text}</text></g>'
            )
    # legend: a bar from vmin to vmax in 20 steps
    ly = top + n * cell + 14
    steps = 20
    for k in range(steps):
        v = vmin + (vmax - vmin) * (k + 0.5) / steps
        fill, _ = cell_colour(v, vmin, vmax)
        out.append(
            f'<rect x="{label_w + k * bar_w / steps:.1f}" y="{ly}" width="{bar_w / steps + 0.5:.1f}" '
            f'height="10" fill="{fill}"/>'
        )
    out.append(f'<rect x="{label_w}" y="{ly}" width="{bar_w}" height="10" fill="none" stroke="#d9e2ec"/>')
    for v, anchor, x in ((vmin, "start", label_w), (vmax, "end", label_w + bar_w)):
        out.append(f'<text x="{x}" y="{ly + 24}" text-anchor="{anchor}" fill="#616e7c">{v:g}</text>')
    if vmin < 0 < vmax:
        zx = label_w + bar_w * (0 - vmin) / (vmax - vmin)
        out.append(f'<text x="{zx:.1f}" y="{ly + 24}" text-anchor="middle" fill="#616e7c">0</text>')
    out.append("</g></svg>")
    return "".join(out)
