"""python manage.py export_predictions --run ID --split S [--retriever SPEC] [--out DIR] [--name NAME]

The evaluation servers' prediction files (:mod:`audit.predictions`): CIRR's test server
(``recall_submission_NAME.json``: top 50; ``recall_subset_submission_NAME.json``: top 3 of the
img_set) and CIRCO's test evaluation (``circo_SPLIT_submission_NAME.json``: top 50 COCO ids).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.models import AuditRun
from audit.predictions import PredictionError, export_predictions


class Command(BaseCommand):
    help = "Write the CIRR test server's or CIRCO's submission file(s) ranked by an audit's retriever."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, required=True, help="A finished audit of the CIRR or CIRCO dataset.")
        parser.add_argument("--split", required=True, help="The split to predict, e.g. test1 (CIRR) or test (CIRCO).")
        parser.add_argument("--retriever", default=None, help="One of the audit's retrievers (default: its first).")
        parser.add_argument("--out", type=Path, default=None, help="Folder (default: var/exports/predictions-<run>).")
        parser.add_argument("--name", default="", help="Appended to the file names, e.g. the model's name.")

    def handle(self, *args, **opts):
        run = AuditRun.objects.filter(pk=opts["run"], status=AuditRun.Status.DONE).select_related("dataset").first()
        if run is None:
            raise CommandError(f"no finished audit run with id {opts['run']}")
        out = opts["out"] or Path(settings.VAR_DIR) / "exports" / f"predictions-{run.pk}"
        try:
            result = export_predictions(run, opts["split"], out, opts["retriever"], opts["name"])
        except PredictionError as exc:
            raise CommandError(str(exc)) from None
        for path in result.files:
            self.stdout.write(f"{path}")
        self.stdout.write(f"{result.queries} queries of {run.dataset.name}:{opts['split']} predicted")
        if result.blank:
            self.stdout.write(self.style.WARNING(result.blank_text()))
