"""python manage.py import_dataset --format FMT --name NAME [--split S] [--subset S] [--images-root DIR] PATH..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from retrieval import importers
from retrieval.imagefiles import within_any
from retrieval.loader import retry_when_locked
from retrieval.services import import_files


class Command(BaseCommand):
    help = "Import CIR annotation files of one public format into a dataset (all or nothing)."

    def add_arguments(self, parser):
        parser.add_argument("--format", required=True, choices=sorted(importers.FORMATS))
        parser.add_argument("--name", required=True, help="Dataset name (slug); re-using it updates in place.")
        parser.add_argument("--split", default=None, help="Override the split read from the file names or content.")
        parser.add_argument(
            "--subset",
            default=None,
            help="Override the subset (CIRCLED) or category (FashionIQ, Multi-turn FashionIQ) read "
            "from the records or file names.",
        )
        parser.add_argument("--images-root", default=None, help="Folder the records' image paths are relative to.")
        parser.add_argument(
            "--delete-removed",
            action="store_true",
            help="On a re-import, delete the stored records of these files that the files no longer "
            "hold (the default refuses the import and names them).",
        )
        parser.add_argument(
            "--attribute-images",
            action="store_true",
            help="Multi-turn FashionIQ: store an image for every ASIN of the attribute files, not only "
            "for those that sessions or galleries use.",
        )
        parser.add_argument("--json", action="store_true", help="Print the import report as JSON.")
        parser.add_argument("paths", nargs="+")

    def handle(self, *args, **opts):
        paths = [Path(p) for p in opts["paths"]]
        for p in paths:
            if not p.is_file():
                raise CommandError(f"{p}: no such file")
        root = Path(opts["images_root"]).resolve() if opts["images_root"] else None
        if root is not None and not root.is_dir():
            raise CommandError(f"--images-root {root}: not a folder")

        def progress(stage: str, done: int, total: int) -> None:
            if not opts["json"] and sys.stderr.isatty():
                sys.stderr.write(f"\r{stage}: {done}/{total}   ")
                sys.stderr.flush()

        def locked(attempt: int, pause: float) -> None:
            sys.stderr.write(
                f"the database is locked by another process (try {attempt}); trying again in {pause:g} s\n"
            )

        try:
            report = retry_when_locked(
                lambda: import_files(
                    opts["format"],
                    opts["name"],
                    paths,
                    split=opts["split"],
                    images_root=root,
                    progress=progress,
                    subset=opts["subset"],
                    delete_removed=opts["delete_removed"],
                    attribute_images=opts["attribute_images"],
                ),
                on_retry=locked,
            )
        except ValueError as exc:  # ParseError, LoadError (DatabaseBusy too): nothing was written
            raise CommandError(f"import failed, nothing written: {exc}") from None
        if opts["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
            return
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        verb = "created" if report.dataset_created else "updated"
        self.stdout.write(
            f"Dataset {report.dataset!r} {verb} ({report.format}): {report.queries} queries "
            f"({report.queries_created} added, {report.queries_updated} changed, {report.queries_removed} removed, "
            f"{report.queries_unchanged} unchanged; "
            f"{report.single_turn} single-turn, {report.multi_turn} multi-turn), {report.turns} turns, "
            f"{report.targets} targets, {report.images} images ({report.images_created} new, "
            f"{report.images_updated} updated), {report.gallery_entries} gallery entries stored."
        )
        if report.missing_images and not report.images_root:
            self.stdout.write(
                self.style.WARNING(
                    f"No --images-root given: the {report.images} images were not looked for and show as placeholders."
                )
            )
        elif report.missing_images:
            examples = ", ".join(report.missing_examples)
            self.stdout.write(
                self.style.WARNING(
                    f"{report.missing_images} of {report.images} images are missing on disk "
                    f"(shown as placeholders), e.g. {examples}"
                )
            )
        if root is not None and not within_any(root, settings.IMAGE_ROOTS):
            self.stdout.write(
                self.style.WARNING(f"{root} is not under IMAGE_ROOTS; its images will not be served until it is added.")
            )
        if report.queries_removed:
            depends = "; ".join(f"{n} {label}" for label, n in report.removed_dependents.items()) or "nothing else"
            self.stdout.write(
                self.style.WARNING(
                    f"Deleted {report.queries_removed} queries no longer in the files (e.g. "
                    f"{', '.join(report.removed_examples)}), with {depends}."
                )
            )
        for w in report.warnings:
            self.stdout.write(self.style.WARNING(w))
