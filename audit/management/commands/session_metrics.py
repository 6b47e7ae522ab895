"""python manage.py session_metrics RANKS.jsonl [--k 10] [--epsilon 30] --format json

Each line: {"session": id, "ranks": [r_1, ..., r_L]} with 1-based ranks of the best
ground truth after each turn (null = not retrieved).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from retrieval.records import ParseError
from retrieval.sessions import session_metrics
from retrieval.validation import Record, is_int, json_type


def read_sessions(path: Path) -> dict:
    """``session -> ranks`` of a JSONL file, each line read through
    :class:`retrieval.validation.Record`; a ParseError names the file, the line and the field."""
    sessions: dict = {}
    first_line: dict = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ParseError(
                    str(path), n - 1, None, f"not JSON ({exc.msg} at column {exc.colno})", record_label=f"line {n}"
                ) from None
            rec = Record(path, n - 1, data, "session line", label=f"line {n}")
            sid, ranks = rec.req_id("session"), _ranks(rec)
            if sid in sessions:
                rec.fail("session", f"{sid!r} already given on line {first_line[sid]}")
            sessions[sid] = ranks
            first_line[sid] = n
    if not sessions:
        raise ParseError(str(path), None, None, "no sessions")
    return sessions


def _ranks(rec: Record) -> list[int | None]:
    """Field ``ranks``: a non-empty list of 1-based ranks or nulls."""
    ranks = rec.req("ranks")
    if not isinstance(ranks, list) or not ranks:
        rec.fail("ranks", f"expected a non-empty list, got {json_type(ranks)}")
    for i, r in enumerate(ranks):
        if r is not None and (not is_int(r) or r < 1):
            rec.fail(f"ranks[{i}]", f"expected a rank >= 1 or null, got {r!r}")
    return ranks


class Command(BaseCommand):
    help = "Hits@K per turn, Final Recall@K, AUC and epsilon-consistency of multi-turn sessions."

    def add_arguments(self, parser):
        parser.add_argument("ranks", type=Path)
        parser.add_argument("--k", type=int, default=10)
        parser.add_argument("--epsilon", type=float, default=30)
        parser.add_argument("--format", choices=["json", "text"], default="text")

    def handle(self, *args, **o):
        if not o["ranks"].is_file():
            raise CommandError(f"{o['ranks']}: no such file")
        if o["k"] < 1:
            raise CommandError("--k must be at least 1")
        try:
            sessions = read_sessions(o["ranks"])
        except ParseError as exc:
            raise CommandError(str(exc)) from None
        result = session_metrics(sessions, k=o["k"], epsilon=o["epsilon"])
        if o["format"] == "json":
            self.stdout.write(json.dumps(result))
            return
        self.stdout.write(f"sessions           {result['n_sessions']}")
        for turn, h in enumerate(result["hits_at_k"], 1):
            self.stdout.write(f"Hits@{o['k']} turn {turn:<3}    {h:.4f}")
        self.stdout.write(f"Final Recall@{o['k']}    {result['final_recall_at_k']:.4f}")
        self.stdout.write(
            f"AUC                {result['auc']:.4f}" if result["auc"] is not None else "AUC                undefined"
        )
        self.stdout.write(
            f"epsilon-consistent {result['epsilon_consistent']} (violations: {result['epsilon_violations']})"
        )
