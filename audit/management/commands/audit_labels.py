"""python manage.py audit_labels RANKS.jsonl: shortcut labels from per-retriever ranks.

One JSON object a line: ``{"query", "retriever", "mm", "text", "image"}`` where each
of the three is a 1-based rank or ``null`` (not retrieved), or a list of the ranks of
every positive target (``[3, null, 17]``; the labels use the best, ``map_at_k`` all). Blank lines are ignored. The
output (``--format json``) is exactly :func:`audit.labels.audit_json` of
:func:`audit.labels.label_queries` over the lines, in file order.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.labels import audit_json, count_lines, label_queries
from audit.rankfiles import check_rank_value
from retrieval.records import ParseError
from retrieval.validation import Record


def parse_rank_line(line: str, number: int, source: str = "<input>") -> tuple[Any, Any, Any, Any, Any]:
    """One JSONL line (``number``, 1-based) as a ``label_queries`` row, its fields read through
    :class:`retrieval.validation.Record`; a ParseError names the source, the line and the field."""
    where = f"line {number}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ParseError(source, number - 1, None, f"not valid JSON ({exc.msg})", record_label=where) from None
    rec = Record(source, number - 1, obj, "line", label=where)
    query, retriever = rec.req_id("query"), rec.req_id("retriever")
    mm, text, image = (check_rank_value(rec, name) for name in ("mm", "text", "image"))
    return query, retriever, mm, text, image


def _refuse_ids_that_collide(rows: list[tuple], source: str) -> None:
    """Two query ids that differ but print the same (``1`` and ``"1"``) would be one key of the
    JSON output's ``labels`` twice: refused, naming both."""
    seen: dict[str, Any] = {}
    for query, *_ in rows:
        first = seen.setdefault(str(query), query)
        if first != query or type(first) is not type(query):
            raise CommandError(
                f"{source}: query ids {first!r} and {query!r} differ but print the same, so they would "
                "be one key twice in the output; write each query's id one way (all strings or all "
                "numbers)"
            )


class Command(BaseCommand):
    help = "Shortcut-audit labels and per-retriever scores from a JSONL file of ranks ('-' reads stdin)."

    def add_arguments(self, parser):
        parser.add_argument("ranks", help="JSONL file of {query, retriever, mm, text, image} lines")
        parser.add_argument("--k", type=int, default=10)
        parser.add_argument("--min-mm-retrievers", type=int, default=1)
        parser.add_argument("--format", choices=["json", "text"], default="json")

    def handle(self, *args, **opts):
        rows = []
        source = "<stdin>" if opts["ranks"] == "-" else opts["ranks"]
        try:
            fh = sys.stdin if opts["ranks"] == "-" else open(opts["ranks"], encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot read {opts['ranks']}: {exc.strerror or exc}") from None
        try:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                rows.append(parse_rank_line(line, number, source))
        except ParseError as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:  # not UTF-8
            raise CommandError(f"{source}: {exc}") from None
        finally:
            if fh is not sys.stdin:
                fh.close()
        _refuse_ids_that_collide(rows, source)
        try:
            audit = label_queries(rows, k=opts["k"], min_mm_retrievers=opts["min_mm_retrievers"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["format"] == "json":
            self.stdout.write(json.dumps(audit_json(audit), indent=2))
            return
        self.stdout.write(f"{len(audit.queries)} queries, {len(audit.retrievers)} retrievers, K={audit.k}")
        for line in count_lines(audit.counts):
            self.stdout.write(line)
