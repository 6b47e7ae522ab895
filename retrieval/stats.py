"""Summary figures of an imported dataset (``manage.py dataset_stats``)."""

from __future__ import annotations

from django.db.models import Count

from .models import Dataset, Image, Query, Target


def dataset_stats(dataset: Dataset) -> dict:
    queries = Query.objects.filter(dataset=dataset)
    n_queries = queries.count()
    histogram = {
        str(row["n_turns"]): row["n"] for row in queries.values("n_turns").annotate(n=Count("id")).order_by("n_turns")
    }
    single = histogram.get("1", 0)
    n_targets = Target.objects.filter(query__dataset=dataset).count()
    images = Image.objects.filter(dataset=dataset)
    return {
        "queries": n_queries,
        "single_turn": single,
        "multi_turn": n_queries - single,
        "images": images.count(),
        "missing_images": images.filter(missing=True).count(),
        "targets_per_query_mean": round(n_targets / n_queries, 6) if n_queries else 0.0,
        "turns_histogram": histogram,
    }
