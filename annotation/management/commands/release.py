"""python manage.py release --study ID [--study ID ...] [--out DIR] [--layout mbeir|circo|circled ...]

Writes a release of the studies (:mod:`annotation.release.bundle`): one folder (default
``EXPORT_DIR/release-<studies>-<timestamp>``; it must be absent or empty) and a zip of it
beside it, holding the validated files in each layout, trace and manifest, agreement and audit
reports, croissant.json, README.md (the dataset card) and SHA256SUMS. Then lists the
croissant.json / README.md fields the publisher must fill in. The staff page's "Make a
release" button runs the same function on a worker.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from annotation.release.bundle import LAYOUTS, ReleaseError, build_release


class Command(BaseCommand):
    help = "Write a release (validated files, reports, croissant.json, dataset card, checksums) and a zip of it."

    def add_arguments(self, parser):
        parser.add_argument("--study", action="append", required=True, type=int, help="Study id (repeatable).")
        parser.add_argument("--out", default=None, help="Release folder (absent or empty); default under EXPORT_DIR.")
        parser.add_argument(
            "--layout",
            action="append",
            choices=LAYOUTS,
            default=None,
            help="Layout(s) of the validated files (repeatable; default M-BEIR, CIRCLED for sessions).",
        )

    def handle(self, *args, **opts):
        started = time.perf_counter()

        def progress(stage: str, done: int, total: int) -> None:
            if opts["verbosity"] >= 2:
                self.stderr.write(f"{stage}: {done} / {total}")

        try:
            result = build_release(opts["study"], opts["out"], layouts=opts["layout"], progress=progress)
        except (ReleaseError, OSError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Release written to {result.path} ({len(result.files)} files) and {result.zip_path} "
            f"in {time.perf_counter() - started:.1f} s."
        )
        self.stdout.write("Fill in these fields of croissant.json and README.md before publishing:")
        for line in result.placeholders:
            self.stdout.write(f"  {line}")
