"""python manage.py apply_alternatives --study ID

Adds the study's accepted alternatives to their datasets as extra targets (role
``alternative``), so that the next audit of the dataset (``manage.py audit``) scores them; the
audit report then shows Recall@K (and mAP@K) before and after."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from annotation.agreement.reports import get_study
from annotation.alternatives.study import apply_alternatives


class Command(BaseCommand):
    help = "Add a study's accepted alternatives to its datasets as extra targets."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="Study id.")

    def handle(self, *args, **opts):
        study = get_study(opts["study"])
        counts = apply_alternatives(study)
        self.stdout.write(
            f"Study {study.pk} ({study.name!r}): {counts['created']} alternatives added as targets, "
            f"{counts['already_targets']} were targets already. Re-audit the dataset to compare."
        )
