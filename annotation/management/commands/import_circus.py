"""python manage.py import_circus --study-name NAME [--dataset-prefix circus]
[--report agreement_report.json --from-report annotator_03,annotator_08] [FILES...]

CIRCUS annotations as a CIRVal study under the validity rubric: see
:mod:`annotation.studies.circus` (the same service runs for the project room's import page).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from annotation.studies.circus import CircusImportError, import_circus_study, summary_line


class Command(BaseCommand):
    help = "Import CIRCUS annotation files (and annotators from an agreement report) as a validity study."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="*", help="annotations/users/*.json or agreement_users/*.json")
        parser.add_argument("--study-name", required=True)
        parser.add_argument(
            "--dataset-prefix",
            default="circus",
            help="Datasets are named <prefix>-<dataset> (default circus; '' for the bare name).",
        )
        parser.add_argument("--report", default=None, help="agreement_report.json, for --from-report.")
        parser.add_argument(
            "--from-report", default="", help="Comma-separated annotators to take from the report's item_level_rows."
        )
        parser.add_argument(
            "--no-verify-checksum", action="store_true", help="Accept files whose assignment_ids_sha256 does not match."
        )

    def handle(self, *args, **opts):
        try:
            summary = import_circus_study(
                opts["files"],
                opts["study_name"],
                opts["dataset_prefix"],
                opts["report"],
                opts["from_report"].split(","),
                not opts["no_verify_checksum"],
            )
        except CircusImportError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(summary_line(summary))
