"""python manage.py session_metrics RANKS.jsonl [--k 10] [--epsilon 30] --format json

Each line: {"session": id, "ranks": [r_1, ..., r_L]} with 1-based ranks of the best
ground truth after each turn (null = not retrieved).
"""
from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from retrieval.sessions import session_metrics


def read_sessions(path: Path) -> dict:
    sessions: dict = {}
    first_line: dict = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path}, line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(rec, dict):
                raise CommandError(f"{path}, line {n}: expected an object")
            for key in ("session", "ranks"):
                if key not in rec:
                    raise CommandError(f"{path}, line {n}, field '{key}': missing")
            sid, ranks = rec["session"], rec["ranks"]
            if not isinstance(sid, (str, int)) or isinstance(sid, bool):
                raise CommandError(f"{path}, line {n}, field 'session': expected a string or an integer")
            if not isinstance(ranks, list) or not ranks:
                raise CommandError(f"{path}, line {n}, field 'ranks': expected a non-empty list")
            for i, r in enumerate(ranks):
                if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
                    raise CommandError(f"{path}, line {n}, field 'ranks[{i}]': expected a rank >= 1 or null, got {r!r}")
            if sid in sessions:
                raise CommandError(f"{path}, line {n}, field 'session': {sid!r} already given on line {first_line[sid]}")
            sessions[sid] = ranks
            first_line[sid] = n
    if not sessions:
        raise CommandError(f"{path}: no sessions")
    return sessions


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
        result = session_metrics(read_sessions(o["ranks"]), k=o["k"], epsilon=o["epsilon"])
        if o["format"] == "json":
            self.stdout.write(json.dumps(result))
            return
        self.stdout.write(f"sessions           {result['n_sessions']}")
        for turn, h in enumerate(result["hits_at_k"], 1):
            self.stdout.write(f"Hits@{o['k']} turn {turn:<3}    {h:.4f}")
        self.stdout.write(f"Final Recall@{o['k']}    {result['final_recall_at_k']:.4f}")
        self.stdout.write(f"AUC                {result['auc']:.4f}" if result["auc"] is not None else "AUC                undefined")
        self.stdout.write(f"epsilon-consistent {result['epsilon_consistent']} (violations: {result['epsilon_violations']})")
