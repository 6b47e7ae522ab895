"""Re-audit after annotators added alternatives: Recall@K (and mAP@K where the run's scores
have it) of each retriever before and after, on the queries that gained alternatives.

Accepted alternatives enter a dataset as :class:`retrieval.models.Target` rows with role
``alternative`` (relevance 1, never primary); the next audit counts them as positives. The
"before" figures come from the newest earlier finished audit of the same dataset that ranked
those queries with the same retriever.
"""

from __future__ import annotations

from typing import Any

from retrieval.models import Target
from retrieval.targets import ALTERNATIVE as ALTERNATIVE_ROLE  # the target rule owns the role

from .models import AuditRun
from .runs.aggregation import subset_scores

#: Metrics compared before/after.
COMPARED = ("recall_at_k", "map_at_k")


def _metric(stats: dict[str, Any], name: str, metric: str) -> float | None:
    value = stats.get(name, {}).get(metric)
    return value.get("multimodal") if isinstance(value, dict) else value


def before_after(run: AuditRun) -> dict[str, Any] | None:
    """The comparison for ``run`` (None when none of its queries gained an alternative or
    no earlier audit of the dataset exists)."""
    gained = set(
        Target.objects.filter(query__dataset=run.dataset, role=ALTERNATIVE_ROLE).values_list("query_id", flat=True)
    )
    if not gained:
        return None
    earlier = (
        AuditRun.objects.filter(dataset=run.dataset, status=AuditRun.Status.DONE, pk__lt=run.pk).order_by("-pk").first()
    )
    if earlier is None:
        return None
    after, before = subset_scores(run, gained), subset_scores(earlier, gained)
    rows = []
    for name in run.retrievers:
        if name not in after or name not in before:
            continue
        rows.append(
            {
                "retriever": name,
                **{
                    f"{m}_{when}": _metric(src, name, m)
                    for m in COMPARED
                    for when, src in (("before", before), ("after", after))
                },
            }
        )
    n_alternatives = Target.objects.filter(query__dataset=run.dataset, role=ALTERNATIVE_ROLE).count()
    return {
        "earlier_run": earlier.pk,
        "k": run.k,
        "n_queries": len(gained),
        "n_alternatives": n_alternatives,
        "rows": rows,
        "has_map": any(r["map_at_k_after"] is not None for r in rows),
    }
