"""python manage.py leaderboard: make a leaderboard, enter methods, write its CSV, JSON and LaTeX.

    manage.py leaderboard --dataset cirr --split val --name main [--metric R@10]
        [--method NAME [--paper URL] (--predictions FORMAT FILE [--predictions FORMAT FILE] |
                                      --rank-file FILE | --audit RUN --retriever SPEC)]
        [--out DIR] [--bootstrap 1000] [--seed 0]

FORMAT: ``cirr`` (a CIRR test-server recall or recall_subset file), ``circo`` (a CIRCO
submission), ``fashioniq`` (top-K lists, one JSON line a query); see
:mod:`audit.leaderboard.files`. A bad file is refused naming its line and query id, and
nothing is stored. ``--out`` writes ``<name>.csv``, ``<name>.json`` and ``<name>.tex``
(:func:`audit.leaderboard.service.write_outputs`), the strings the page shows.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.leaderboard.entries import EntryError, enter_audit, enter_predictions, enter_rank_file
from audit.leaderboard.files import FORMATS
from audit.leaderboard.service import DEFAULT_BOOT, DEFAULT_SEED, display_table, leaderboard_table, write_outputs
from audit.models import AuditRun, Leaderboard
from retrieval.models import Dataset


class Command(BaseCommand):
    help = "Make a leaderboard, enter a method (prediction files, a rank file or an audit retriever), write its tables."

    def add_arguments(self, parser):
        parser.add_argument("--dataset", required=True)
        parser.add_argument("--split", required=True)
        parser.add_argument("--name", required=True, help="The leaderboard's name (made when new).")
        parser.add_argument("--metric", default=None, help="The protocol figure it ranks by (default R@10).")
        parser.add_argument("--method", default="", help="The name of the method to enter.")
        parser.add_argument("--paper", default="", help="The method's paper (a URL).")
        parser.add_argument(
            "--predictions",
            nargs=2,
            action="append",
            metavar=("FORMAT", "FILE"),
            default=[],
            help=f"A prediction file and its format ({', '.join(FORMATS)}); repeat for several.",
        )
        parser.add_argument("--rank-file", default=None, help="A CIRCUS per-retriever rank file.")
        parser.add_argument(
            "--audit", type=int, default=None, help="A finished audit run of the dataset (with --retriever)."
        )
        parser.add_argument("--retriever", default=None)
        parser.add_argument("--out", default=None, help="Write <name>.csv, <name>.json and <name>.tex here.")
        parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOT, help="Bootstrap replicates (default 1000).")
        parser.add_argument("--seed", type=int, default=DEFAULT_SEED)

    def _board(self, opts) -> Leaderboard:
        dataset = Dataset.objects.filter(name=opts["dataset"]).first()
        if dataset is None:
            raise CommandError(f"no dataset named {opts['dataset']!r}")
        board, made = Leaderboard.objects.get_or_create(
            dataset=dataset, split=opts["split"], name=opts["name"], defaults={"metric": opts["metric"] or "R@10"}
        )
        if opts["metric"] and board.metric != opts["metric"]:
            board.metric = opts["metric"]
            board.save(update_fields=["metric"])
        if made:
            self.stdout.write(f"leaderboard {board.name!r} made ({dataset.name} {board.split}, {board.metric})")
        return board

    def _enter(self, board: Leaderboard, opts) -> None:
        sources = [bool(opts["predictions"]), bool(opts["rank_file"]), opts["audit"] is not None]
        if sum(sources) > 1:
            raise CommandError("give one of --predictions, --rank-file or --audit")
        if not any(sources):
            return
        if opts["predictions"]:
            if not opts["method"]:
                raise CommandError("--predictions needs --method NAME")
            for fmt, _ in opts["predictions"]:
                if fmt not in FORMATS:
                    raise CommandError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
            entry = enter_predictions(
                board, opts["method"], [(f, fmt) for fmt, f in opts["predictions"]], opts["paper"]
            )
        elif opts["rank_file"]:
            entry = enter_rank_file(board, opts["rank_file"], opts["method"], opts["paper"])
        else:
            run = AuditRun.objects.filter(pk=opts["audit"]).first()
            if run is None or not opts["retriever"]:
                raise CommandError("--audit needs an existing run and --retriever SPEC")
            entry = enter_audit(board, run, opts["retriever"], opts["method"], opts["paper"])
        self.stdout.write(f"entered {entry.name!r} ({entry.source}: {entry.source_detail})")

    def handle(self, *args, **opts):
        if opts["bootstrap"] < 0:
            raise CommandError("--bootstrap must be 0 or more")
        board = self._board(opts)
        try:
            self._enter(board, opts)
        except EntryError as exc:
            raise CommandError(f"refused, nothing stored: {exc}") from None
        if not board.entries.exists():
            self.stdout.write("no method entered yet")
            return
        data = leaderboard_table(board, n_boot=opts["bootstrap"], seed=opts["seed"])
        shown = display_table(data)
        widths = [max(len(r[i]) for r in [shown["headers"], *shown["rows"]]) for i in range(len(shown["headers"]))]
        for row in [shown["headers"], *shown["rows"]]:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        self.stdout.write(shown["tau"])
        if opts["out"]:
            for path in write_outputs(data, Path(opts["out"]), board.name):
                self.stdout.write(f"wrote {path}")
