"""python manage.py audit_report (--run ID | --dataset NAME): a finished audit's labels and figures.

The JSON (``--format json``) has the shape of ``audit_labels --format json``
(:func:`audit.labels.audit_json`), computed from the run's stored ranks, plus a ``protocol``
key: the benchmark's own figures (:func:`audit.protocol.run_protocol`; ``null`` for a format
without a published protocol); queries are named by their external ids. With ``--dataset`` the newest finished run of that dataset
is reported.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from audit.labels import count_lines
from audit.models import AuditRun
from audit.report import audit_report_json
from audit.runs.aggregation import stored_labels
from config.figures import fixed


def finished_run(run_id: int | None, dataset: str | None) -> AuditRun:
    """The run asked for: by id (must be finished), or the newest finished run of a dataset."""
    done = AuditRun.objects.filter(status=AuditRun.Status.DONE).select_related("dataset")
    if run_id is not None:
        run = done.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no finished audit run with id {run_id}")
        return run
    run = done.filter(dataset__name=dataset).order_by("-finished_at", "-pk").first()
    if run is None:
        raise CommandError(f"dataset {dataset!r} has no finished audit run")
    return run


class Command(BaseCommand):
    help = "Label counts, detail counts and per-retriever figures of a finished audit (as audit_labels prints them)."

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--run", type=int)
        which.add_argument("--dataset")
        parser.add_argument("--format", choices=["json", "text"], default="json")

    def handle(self, *args, **opts):
        run = finished_run(opts["run"], opts["dataset"])
        if opts["format"] == "json":
            self.stdout.write(json.dumps(audit_report_json(run), indent=2))
            return
        audit = stored_labels(run)
        self.stdout.write(
            f"audit {run.pk} of {run.dataset.name}: {len(audit.queries)} queries, "
            f"{len(audit.retrievers)} retrievers, K={audit.k}"
        )
        for line in count_lines(audit.counts):
            self.stdout.write(line)
        for name, stats in audit.retriever_stats.items():
            recall = ", ".join(
                f"{m} {fixed(v, 3)}" if v is not None else f"{m} -" for m, v in stats["recall_at_k"].items()
            )
            self.stdout.write(f"  {name}: Recall@{audit.k} {recall}")
