"""Export the sessions written in an interactive study: CIRCLED files, traces and a manifest."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from annotation.interactive.session_export import export_interactive
from annotation.models import Study


class Command(BaseCommand):
    help = "Write an interactive study's ended sessions in the CIRCLED layout (with a trace per subset)."

    def add_arguments(self, parser):
        parser.add_argument("--study", required=True, help="Study name or id.")
        parser.add_argument("--out", default=None, help="An absent or empty folder (default: under EXPORT_DIR).")

    def handle(self, *args, **opts):
        key = opts["study"]
        study = Study.objects.filter(pk=int(key)).first() if key.isdigit() else Study.objects.filter(name=key).first()
        if study is None:
            raise CommandError(f"no study {key!r}")
        if not study.interactive:
            raise CommandError(f"study {study.name!r} is not interactive")
        folder = export_interactive(study, opts["out"])
        self.stdout.write(str(folder))
