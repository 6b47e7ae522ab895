"""python manage.py import_gallery --dataset NAME --split val [--split test] (--ids FILE | --folder DIR)

Adds a retrieval gallery to an imported dataset (:mod:`retrieval.gallery_import`): CIRCO's
123,403-image COCO 2017 unlabeled gallery from COCO's ``image_info_unlabeled2017.json``, a
list of ids, or a folder of images under the dataset's images root.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from retrieval.gallery_import import GalleryImportError, ids_from_file, ids_from_folder, import_gallery
from retrieval.models import Dataset


class Command(BaseCommand):
    help = "Add a gallery (a folder of images or a list of COCO ids) to the given splits of a dataset."

    def add_arguments(self, parser):
        parser.add_argument("--dataset", required=True)
        parser.add_argument(
            "--split",
            action="append",
            required=True,
            help="The split whose gallery it is (repeat for several, e.g. --split val --split test).",
        )
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--ids", type=Path, help="COCO ids: one per line, a JSON list, or COCO's image info JSON.")
        source.add_argument(
            "--folder", type=Path, help="Every .jpg/.jpeg/.png under this folder (inside the images root)."
        )
        parser.add_argument("--format", choices=["json", "text"], default="text")

    def handle(self, *args, **opts):
        dataset = Dataset.objects.filter(name=opts["dataset"]).first()
        if dataset is None:
            raise CommandError(f"no dataset named {opts['dataset']!r}")
        started = time.monotonic()

        def progress(done: int) -> None:
            if opts["format"] == "text":
                self.stdout.write(f"  {done:,} images listed ({time.monotonic() - started:.0f} s)")

        try:
            if opts["ids"] is not None:
                if not opts["ids"].is_file():
                    raise CommandError(f"no such file: {opts['ids']}")
                items = ids_from_file(opts["ids"])
            else:
                if not opts["folder"].is_dir():
                    raise CommandError(f"no such folder: {opts['folder']}")
                items = ids_from_folder(opts["folder"], Path(dataset.images_root or "."))
            report = import_gallery(dataset, opts["split"], items, progress)
        except (GalleryImportError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CommandError(str(exc)) from None
        if opts["format"] == "json":
            self.stdout.write(json.dumps(asdict(report), indent=2))
            return
        sizes = ", ".join(f"{s}: {n:,}" for s, n in report.gallery_sizes.items())
        self.stdout.write(
            f"{report.listed:,} images listed, {report.images_created:,} new, "
            f"{report.entries_created:,} gallery entries added; galleries {sizes}"
        )
        if report.missing:
            self.stdout.write(
                f"{report.missing:,} without a readable file (left out of audits), e.g. "
                + "; ".join(report.missing_examples[:3])
            )
