"""Leaderboard pages (researchers): the list, and one board's tables and charts."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404, render
from django.utils.safestring import mark_safe

from config.roles import researcher_required

from .. import charts
from ..models import Leaderboard
from .scoring import SETS, VALIDATED
from .service import DEFAULT_BOOT, DEFAULT_SEED, display_table, leaderboard_table

MAX_BOOT = 5000
#: The sets' names on the chart's x axis (short enough for four labels).
SHORT = {"full": "Full", "validated": "Validated", "validated_alternatives": "Val.+alt."}


def _int_param(request, name: str, default: int, high: int) -> int:
    value = request.GET.get(name, "")
    return min(max(int(value), 0), high) if value.isdigit() else default


def _legend_width(series: dict) -> int:
    """Wide enough for the line chart's legend on one row (the spacing of ``audit.charts._line_legend``:
    a 42 px sample, 7 px a character, at least 170 px an entry), plus the plot's left margin."""
    return int(max(960, 100 + sum(max(170, 42 + len(name) * charts.CHAR_W + 18) for name in series)))


def _charts(data: dict[str, Any]) -> list:
    keys = [s["key"] for s in data["sets"]]
    series = {r["name"]: [r["cells"][k]["value"] for k in keys] for r in data["rows"]}
    scores = charts.line_panels_svg(
        [(f"{data['metric']} per set", series)],
        [SHORT.get(k, SETS[k]) for k in keys],
        f"{data['metric']} of each method on each set (lines that cross change places)",
        x_label="set",
        y_label=data["metric"],
        height=320,
        width=_legend_width(series),
    )
    changes = {
        (f"{r['name']} ({r['rank_full']} → {r['rank_validated']})", "places climbed"): r["rank_change"]
        for r in data["rows"]
    }
    span = max([abs(v) for v in changes.values() if v is not None] + [1])
    ranks = charts.grouped_hbar_svg(
        [row for row, _ in changes],
        ["places climbed"],
        changes,
        f"Rank change, Full → {SETS[VALIDATED]} (positive: the method climbed)",
        lo=-span,
        hi=span,
    )
    return [mark_safe(ranks), mark_safe(scores)]


@researcher_required
def leaderboard_list(request):
    boards = Leaderboard.objects.select_related("dataset").prefetch_related("entries")
    return render(request, "audit/leaderboards.html", {"boards": boards})


@researcher_required
def leaderboard_detail(request, pk: int):
    board = get_object_or_404(Leaderboard.objects.select_related("dataset"), pk=pk)
    n_boot = _int_param(request, "bootstrap", DEFAULT_BOOT, MAX_BOOT)
    seed = _int_param(request, "seed", DEFAULT_SEED, 2**31)
    data = leaderboard_table(board, n_boot=n_boot, seed=seed) if board.entries.exists() else None
    return render(
        request,
        "audit/leaderboard.html",
        {
            "board": board,
            "data": data,
            "shown": display_table(data) if data else None,
            "charts": _charts(data) if data else [],
        },
    )
