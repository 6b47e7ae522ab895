"""A leaderboard's sets, its table and the table's files (Django; thin around :mod:`.scoring`).

The sets come from where each is made: the shortcut-free queries from the labels of the
newest finished audit of the split (:data:`audit.labels.SHORTCUT_FREE`), the validated
queries from the dataset's ``validated`` subset (which the validated export writes), the
accepted alternatives from the targets of role ``alternative`` (which ``apply_alternatives``
writes); the table (:func:`leaderboard_table`) is one JSON-ready dict, and the page, the CSV,
the JSON and the LaTeX all print :func:`display_table` of it, so they cannot disagree.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from config.figures import fixed
from retrieval.models import VALIDATED_SUBSET, QuerySubset

from ..labels import SHORTCUT_FREE
from ..models import AuditLabel, AuditRun, Leaderboard
from .entries import entry_ranks, protocol_of, split_targets
from .scoring import FULL, GAP_SETS, SETS, SHORTCUT_FREE_SET, VALIDATED, VALIDATED_ALTERNATIVES, Table, build_table

DEFAULT_BOOT, DEFAULT_SEED = 1000, 0


def labels_run(board: Leaderboard) -> AuditRun | None:
    """The newest finished audit of the board's split whose labels make the shortcut-free set."""
    return (
        AuditRun.objects.filter(dataset=board.dataset, status=AuditRun.Status.DONE, split=board.split)
        .order_by("-pk")
        .first()
    )


def board_sets(board: Leaderboard, full: list[int]) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The four sets (query ids, in the split's order) and where each came from."""
    run = labels_run(board)
    free = (
        set(
            AuditLabel.objects.filter(run=run, label__in=SHORTCUT_FREE, query_id__in=full).values_list(
                "query_id", flat=True
            )
        )
        if run
        else set()
    )
    subset = QuerySubset.objects.filter(dataset=board.dataset, name=VALIDATED_SUBSET).first()
    validated = set(subset.queries.filter(pk__in=full).values_list("pk", flat=True)) if subset else set()
    sets = {
        FULL: full,
        SHORTCUT_FREE_SET: [q for q in full if q in free],
        VALIDATED: [q for q in full if q in validated],
        VALIDATED_ALTERNATIVES: [q for q in full if q in validated],
    }
    sources = {
        FULL: f"every single-turn query of split {board.split}",
        SHORTCUT_FREE_SET: f"labels of audit {run.pk}" if run else "no finished audit of the split",
        VALIDATED: f"subset '{VALIDATED_SUBSET}' ({subset.source or 'export'})"
        if subset
        else "no validated export yet",
        VALIDATED_ALTERNATIVES: "the validated queries, accepted alternatives counted as positives",
    }
    return sets, sources


def _interval(value: float | None, bounds: tuple[float, float] | None) -> dict[str, float | None]:
    low, high = bounds if bounds else (None, None)
    return {"value": value, "low": low, "high": high}


def _rows(board: Leaderboard, table: Table, entries: list) -> list[dict[str, Any]]:
    u = table.uncertainty
    rows = []
    for e in entries:
        full, validated = table.values[(e.name, FULL)], table.values[(e.name, VALIDATED)]
        change = table.changes[e.name]
        rows.append(
            {
                "name": e.name,
                "paper": e.paper,
                "source": e.source,
                "detail": e.source_detail,
                "cells": {s: _interval(table.values[(e.name, s)], u.cells.get((e.name, s))) for s in SETS},
                "difference": _interval(
                    None if full is None or validated is None else validated - full,
                    u.differences.get((e.name, VALIDATED)),
                ),
                "rank_full": change["before"],
                "rank_validated": change["after"],
                "rank_change": change["change"],
                "comp_gap": {s: table.gaps.get((e.name, s)) for s in GAP_SETS},
                "figures": table.full_figures[e.name],
            }
        )
    return sorted(rows, key=lambda r: (r["rank_full"] is None, r["rank_full"] or 0, r["name"]))


def leaderboard_table(board: Leaderboard, n_boot: int = DEFAULT_BOOT, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """The board's table as JSON (fractions; intervals ``low``/``high``; ``None``: undefined)."""
    protocol, targets = protocol_of(board), split_targets(board)
    entries = list(board.entries.all())
    sets, sources = board_sets(board, [q.pk for q in targets.queries])
    table = build_table(
        protocol, board.metric, sets, {e.name: entry_ranks(e) for e in entries}, n_boot=n_boot, seed=seed
    )
    return {
        "leaderboard": board.name,
        "dataset": board.dataset.name,
        "split": board.split,
        "benchmark": protocol.title,
        "protocol_source": protocol.source,
        "metric": board.metric,
        "sets": [
            {"key": s, "title": title, "queries": len(sets[s]), "source": sources[s]} for s, title in SETS.items()
        ],
        "bootstrap": {"replicates": n_boot, "seed": seed, "confidence": table.uncertainty.confidence},
        "tau": _interval(table.tau, table.uncertainty.tau.get(VALIDATED)),
        "rows": _rows(board, table, entries),
        "comp_gap_sets": [{"key": s, "title": SETS[s]} for s in GAP_SETS],
        "comp_gap_definition": "Composition Gap on nDCG: 1 − max(image only, text only) / multimodal",
    }


# ----------------------------------------------------------------------------- one display


def pct(value: float | None, signed: bool = False) -> str:
    """A fraction as the table prints it: percent, one decimal ("–": undefined)."""
    if value is None:
        return "–"
    return fixed(100 * value, 1, signed=signed)


def with_interval(cell: dict[str, float | None], signed: bool = False) -> str:
    text = pct(cell["value"], signed)
    if cell["value"] is None or cell["low"] is None:
        return text
    return f"{text} [{pct(cell['low'], signed)}, {pct(cell['high'], signed)}]"


def rank_text(row: dict[str, Any]) -> str:
    if row["rank_change"] is None:
        return "–" if row["rank_full"] is None else f"{row['rank_full']} → –"
    return f"{row['rank_full']} → {row['rank_validated']} ({row['rank_change']:+d})"


def gap_text(value: float | None) -> str:
    return "–" if value is None else fixed(value, 3)


def display_table(data: dict[str, Any]) -> dict[str, Any]:
    """The strings every output prints: the score table (headers, rows), the CompGap table and
    the tau-b line."""
    metric = data["metric"]
    headers = [
        "Method",
        *[f"{s['title']} {metric}" for s in data["sets"]],
        f"Δ Full → Validated {metric}",
        "Rank Full → Validated",
    ]
    rows = [
        [
            r["name"],
            *[with_interval(r["cells"][s["key"]]) for s in data["sets"]],
            with_interval(r["difference"], signed=True),
            rank_text(r),
        ]
        for r in data["rows"]
    ]
    gap_headers = ["Method", *[f"CompGap {s['title']}" for s in data["comp_gap_sets"]]]
    gap_rows = [
        [r["name"], *[gap_text(r["comp_gap"][s["key"]]) for s in data["comp_gap_sets"]]]
        for r in data["rows"]
        if any(v is not None for v in r["comp_gap"].values())
    ]
    tau = data["tau"]
    tau_line = "Kendall's τ-b, Full vs Validated ordering: " + (
        "undefined"
        if tau["value"] is None
        else fixed(tau["value"], 3)
        + ("" if tau["low"] is None else f" [{fixed(tau['low'], 3)}, {fixed(tau['high'], 3)}]")
    )
    return {"headers": headers, "rows": rows, "gap_headers": gap_headers, "gap_rows": gap_rows, "tau": tau_line}


def to_csv(data: dict[str, Any]) -> str:
    shown = display_table(data)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(shown["headers"])
    writer.writerows(shown["rows"])
    writer.writerow([])
    writer.writerow(shown["gap_headers"])
    writer.writerows(shown["gap_rows"])
    writer.writerow([])
    writer.writerow([shown["tau"]])
    return buf.getvalue()


_LATEX = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "–": "--",
    "→": r"$\to$",
    "Δ": r"$\Delta$",
    "τ": r"$\tau$",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX.get(c, c) for c in text)


def _latex_tabular(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = [
        r"\begin{tabular}{l" + "r" * (len(headers) - 1) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in headers) + r" \\",
        r"\midrule",
    ]
    out += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in rows]
    return out + [r"\bottomrule", r"\end{tabular}"]


def to_latex(data: dict[str, Any]) -> str:
    """Two booktabs tables (scores; Composition Gap) ready for a paper, the same strings as the page."""
    shown = display_table(data)
    caption = (
        f"{data['benchmark']} {data['metric']} on {data['dataset']} {data['split']} before and after cleaning "
        f"(95% bootstrap intervals, {data['bootstrap']['replicates']} replicates, seed {data['bootstrap']['seed']}). "
        f"{shown['tau']}."
    )
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        *_latex_tabular(shown["headers"], shown["rows"]),
        r"\caption{" + latex_escape(caption) + "}",
        r"\end{table}",
    ]
    if shown["gap_rows"]:
        lines += [
            "",
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            *_latex_tabular(shown["gap_headers"], shown["gap_rows"]),
            r"\caption{" + latex_escape(data["comp_gap_definition"]) + "}",
            r"\end{table}",
        ]
    return "\n".join(lines) + "\n"


def write_outputs(data: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """``<stem>.csv``, ``<stem>.json`` and ``<stem>.tex`` in ``out_dir`` (written whole, then renamed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, text in (
        ("csv", to_csv(data)),
        ("json", json.dumps(data, indent=2, default=str) + "\n"),
        ("tex", to_latex(data)),
    ):
        path = out_dir / f"{stem}.{suffix}"
        tmp = path.with_suffix(f".{suffix}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        paths.append(path)
    return paths
