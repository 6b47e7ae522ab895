"""python manage.py recount_study_sizes [--study ID ...]

Counts each study's sizes (``Study.n_items``, ``n_agreement``, ``n_extra_slots``,
``n_annotators``) again from its rows and stores them: the repair path after rows were
written around the application (raw SQL, a restored table). Prints the studies whose stored
sizes were off, and by how much."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from annotation.models import Study
from annotation.sizes import recount, stored_sizes


class Command(BaseCommand):
    help = "Count the studies' item and annotator sizes again from their rows."

    def add_arguments(self, parser):
        parser.add_argument("--study", type=int, action="append", help="Study id (repeatable; default: every study).")

    def handle(self, *args, **opts):
        ids = opts["study"] or list(Study.objects.order_by("pk").values_list("pk", flat=True))
        if missing := set(ids) - set(Study.objects.filter(pk__in=ids).values_list("pk", flat=True)):
            raise CommandError(f"no study with id {', '.join(map(str, sorted(missing)))}")
        off = 0
        for study_id in ids:
            before = stored_sizes(study_id)
            after = recount(study_id)
            diff = {k: f"{before[k]} -> {v}" for k, v in after.items() if before[k] != v}
            if diff:
                off += 1
                self.stdout.write(f"study {study_id}: {', '.join(f'{k} {d}' for k, d in diff.items())}")
        self.stdout.write(f"{len(ids)} studies counted, {off} were off.")
