"""python manage.py import_ranks: external rank files (CIRCUS layout) as an audit run."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.imports import ImportRanksError, import_rank_files, import_summary
from audit.rankfiles import RankFileError


class Command(BaseCommand):
    help = (
        "Import CIRCUS rank files: per-retriever retrieval_data_<ds>_task7_<retriever>.json files (several "
        "make a pool) or one aggregated audit file. Samples are matched to queries by query_idx = "
        "Query.ordinal (0-based position of the query in its source file). Labels are computed as for "
        "computed audits. With --run, the retrievers join that finished run's pool and it is relabelled."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+")
        parser.add_argument("--dataset", required=True)
        parser.add_argument(
            "--split",
            default="",
            help="The scope the files rank, as for run_audit: a split (val) or a category of one (dress/val); needed when several source files (splits, FashionIQ categories) share ordinals.",
        )
        parser.add_argument("--k", type=int, default=None, help="Default: metadata.k of the files (else 10).")
        parser.add_argument("--min-mm-retrievers", type=int, default=1)
        parser.add_argument("--run", type=int, default=None, help="Add to this finished audit instead.")
        parser.add_argument(
            "--force",
            action="store_true",
            help="Import even if the files' query texts differ from the dataset's (refused otherwise).",
        )

    def handle(self, *args, **opts):
        try:
            run, report = import_rank_files(
                opts["dataset"],
                opts["files"],
                split=opts["split"] or None,
                k=opts["k"],
                min_mm_retrievers=opts["min_mm_retrievers"],
                run=opts["run"],
                force=opts["force"],
            )
        except (ImportRanksError, RankFileError) as exc:
            raise CommandError(str(exc)) from None
        lines, warnings = import_summary(run, report)
        for line in lines:
            self.stdout.write(line)
        for warning in warnings:
            self.stderr.write(warning)
