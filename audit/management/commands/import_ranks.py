"""python manage.py import_ranks: external rank files (CIRCUS layout) as an audit run."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.imports import ImportRanksError, import_rank_files
from audit.labels import COUNT_KEYS
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
        parser.add_argument("--split", default="", help="Needed when several splits share ordinals.")
        parser.add_argument("--k", type=int, default=None, help="Default: metadata.k of the files (else 10).")
        parser.add_argument("--min-mm-retrievers", type=int, default=1)
        parser.add_argument("--run", type=int, default=None, help="Add to this finished audit instead.")

    def handle(self, *args, **opts):
        try:
            run, report = import_rank_files(
                opts["dataset"], opts["files"], split=opts["split"] or None, k=opts["k"],
                min_mm_retrievers=opts["min_mm_retrievers"], run=opts["run"],
            )
        except (ImportRanksError, RankFileError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Audit {run.pk}: {report['rows']} rank rows from {len(report['files'])} file(s), "
            f"retrievers {', '.join(report['retrievers'])}; K={run.k}."
        )
        if report["unknown_query_idx"]:
            self.stderr.write(f"warning: {report['unknown_query_idx']} sample(s) match no query "
                              f"(query_idx e.g. {report['unknown_examples']})")
        if report["text_mismatches"]:
            self.stderr.write(f"warning: {report['text_mismatches']} query text(s) differ from the dataset's "
                              f"(query_idx e.g. {report['text_mismatch_examples']})")
        if "label_agreement" in report:
            a = report["label_agreement"]
            self.stdout.write(f"Labels agree with the file's for {a['same']} queries, differ for {a['different']}.")
        counts = run.summary.get("counts", {})
        for label in COUNT_KEYS:
            self.stdout.write(f"  {label:<22}{counts.get(label, 0):>8}")
