"""python manage.py dataset_stats NAME [--format json|text]"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from retrieval.models import Dataset
from retrieval.stats import dataset_stats


class Command(BaseCommand):
    help = "Print the query, image, target and turn counts of a dataset."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--format", choices=["json", "text"], default="text")

    def handle(self, *args, **opts):
        dataset = Dataset.objects.filter(name=opts["name"]).first()
        if dataset is None:
            known = ", ".join(Dataset.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no dataset named {opts['name']!r} (known: {known})")
        stats = dataset_stats(dataset)
        if opts["format"] == "json":
            self.stdout.write(json.dumps(stats))
            return
        for key, value in stats.items():
            self.stdout.write(f"{key:24} {value}")
