"""The leaderboards of a release (issue 40): every leaderboard of a released dataset, its table
written as ``leaderboards/<dataset>-<split>-<name>.csv|json|tex`` and shown in the dataset card.

Both read :func:`audit.leaderboard.service.leaderboard_table` with the release's fixed seed
(0) and the default 1000 replicates, so the card and the files print the same strings
(:func:`audit.leaderboard.service.display_table`) and a release made again is the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from annotation.release.names import ServerPaths
from audit.leaderboard.service import DEFAULT_BOOT, display_table, leaderboard_table, write_outputs
from audit.models import AuditRun, Leaderboard

FOLDER = "leaderboards"
SEED = 0


def release_boards(parts: list) -> list[Leaderboard]:
    """The leaderboards (with at least one method) of the datasets the released studies audited."""
    datasets = {run.dataset_id for part in parts for run in part.runs.values()}
    return [
        b
        for b in Leaderboard.objects.filter(dataset_id__in=datasets)
        .select_related("dataset")
        .order_by("dataset__name", "split", "name")
        if b.entries.exists()
    ]


def stem(board: Leaderboard) -> str:
    return f"{board.dataset.name}-{board.split}-{board.name}".replace("/", "_")


def _tables(boards: list[Leaderboard]) -> list[dict[str, Any]]:
    """Each board's table, every checkpoint path of an audit retriever's spec (in a method's name
    or source) written as its file name, as the rest of the release names them."""
    specs = [
        s
        for r in AuditRun.objects.filter(dataset_id__in={b.dataset_id for b in boards}).values_list(
            "retrievers", flat=True
        )
        for s in r or []
    ]
    return ServerPaths(specs).clean([leaderboard_table(b, DEFAULT_BOOT, SEED) for b in boards])


def write_leaderboards(parts: list, root: Path) -> list[Path]:
    """Each board's CSV, JSON and LaTeX under ``root/leaderboards/``."""
    boards = release_boards(parts)
    return [
        path for board, data in zip(boards, _tables(boards)) for path in write_outputs(data, root / FOLDER, stem(board))
    ]


def _md(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def leaderboard_lines(parts: list) -> list[str]:
    """The card's section: each board's score table, its tau-b and its Composition Gap table."""
    boards = release_boards(parts)
    if not boards:
        return []
    out = [
        "## Leaderboards before and after cleaning",
        "",
        "Methods scored with each benchmark's own protocol on the full split, its shortcut-free subset, the "
        "validated subset and the validated subset with the accepted alternatives as extra positives; 95 % "
        f"bootstrap intervals over queries ({DEFAULT_BOOT} replicates, seed {SEED}). The same tables are in "
        f"`{FOLDER}/` as CSV, JSON and LaTeX.",
        "",
    ]
    for board, data in zip(boards, _tables(boards)):
        shown = display_table(data)
        out += [
            f"### `{board.name}`: {data['dataset']} {data['split']}, {data['benchmark']} {data['metric']}",
            "",
            _md(shown["headers"]),
            _md(["---"] * len(shown["headers"])),
            *[_md(r) for r in shown["rows"]],
            "",
            f"{shown['tau']}.",
            "",
        ]
        if shown["gap_rows"]:
            out += [
                f"{data['comp_gap_definition']}:",
                "",
                _md(shown["gap_headers"]),
                _md(["---"] * len(shown["gap_headers"])),
                *[_md(r) for r in shown["gap_rows"]],
                "",
            ]
    return out
