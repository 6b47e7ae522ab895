"""Audit runs: a shortcut audit of one dataset split with a pool of retrievers.

A run is planned into *chunks* (one retriever times one slice of the gallery or of the
queries); each chunk is one Celery task on the ``gpu`` queue. Chunks carry a lease
(``owner``, ``started_at``, ``heartbeat_at``) so that a chunk whose worker died can be
found and run again (see :mod:`audit.runs`). Rank rows are unique per (run, query,
retriever), labels per (run, query), session rank rows per (run, query, retriever,
strategy, modality).

Multi-turn queries (sessions) are scored turn by turn in ``sessions`` chunks (see
:mod:`retrieval.sessions`); a ``texts`` chunk encodes every session's texts with the
run's ``tau_encoder`` for the tau-diversity filter.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from retrieval.jobs.job_progress import eta_seconds
from retrieval.jobs.models import Leased, Progress
from retrieval.models import Dataset, Query


class AuditRun(Progress):
    QUEUE = "gpu"  # its chunks' queue (settings.CELERY_TASK_ROUTES)

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    class Source(models.TextChoices):
        COMPUTED = "computed"  # ranks computed here by open_clip retrievers
        IMPORTED = "imported"  # ranks read from external rank files (import_ranks)

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="audit_runs")
    split = models.CharField(max_length=50, blank=True)
    retrievers = models.JSONField(
        default=list, help_text="Retriever pool: spec strings (and external retriever names)."
    )
    external_retrievers = models.JSONField(
        default=list, blank=True, help_text="Names in the pool whose ranks were imported, not computed here."
    )
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.COMPUTED)
    k = models.PositiveIntegerField(default=10)
    min_mm_retrievers = models.PositiveIntegerField(default=1)
    exclude_reference = models.BooleanField(default=True)
    chunk_queries = models.PositiveIntegerField(default=512)
    chunk_gallery = models.PositiveIntegerField(default=4096)
    epsilon = models.FloatField(
        default=30.0, help_text="Sessions: epsilon-consistency margin (r_{l+1} <= r_l + epsilon)."
    )
    tau = models.FloatField(default=0.8, help_text="Sessions: a pair of texts with cosine >= tau removes the session.")
    tau_encoder = models.CharField(
        max_length=500, blank=True, help_text="Sessions: retriever spec whose text encoder the tau filter uses."
    )
    caption_join = models.CharField(
        max_length=10,
        default="cirval",
        help_text="How a turn's captions become one text (retrieval.captions): cirval or clip4cir.",
    )

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    planned = models.BooleanField(default=False)
    done = models.PositiveBigIntegerField(
        default=0, help_text="Work items finished (gallery images + queries, all retrievers)."
    )
    total = models.PositiveBigIntegerField(default=0)
    eta_seconds = models.FloatField(null=True, blank=True, help_text="Estimate at the last finished chunk.")
    timings = models.JSONField(default=dict, blank=True)
    summary = models.JSONField(default=dict, blank=True, help_text="Plan, skips, label counts and scores.")
    error = models.TextField(blank=True)

    coordinator_token = models.CharField(max_length=32, blank=True)
    coordinator_seen_at = models.DateTimeField(null=True, blank=True)

    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"audit {self.pk} of {self.dataset_id}:{self.split or '*'}"

    def eta(self) -> float | None:
        return self.live_eta_seconds()

    def live_eta_seconds(self) -> float | None:
        """Seconds left, from the rate so far (``None`` before the first chunk ends)."""
        if self.status != self.Status.RUNNING or not self.started_at:
            return None
        return eta_seconds(self.done, self.total, (timezone.now() - self.started_at).total_seconds())


class AuditChunk(Leased):
    """One task: a retriever and a slice of the gallery (encode), of the single-turn
    queries (rank), of the sessions (rank every turn) or of the sessions' texts (tau)."""

    class Kind(models.TextChoices):
        GALLERY = "gallery"
        QUERIES = "queries"
        SESSIONS = "sessions"
        TEXTS = "texts"

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    WAITING = Status.PENDING.value

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="chunks")
    retriever = models.CharField(max_length=500)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    index = models.PositiveIntegerField()
    items = models.JSONField(default=list, help_text="Image ids (gallery) or query ids (the other kinds), in order.")
    n_items = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    stats = models.JSONField(default=dict, blank=True, help_text="Timings, cache hits, skipped queries.")

    class Meta:
        ordering = ["run", "retriever", "kind", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "retriever", "kind", "index"], name="audit_chunk_unique")]
        indexes = [models.Index(fields=["run", "status"])]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.retriever} {self.kind}#{self.index} ({self.status})"

    @classmethod
    def unfinished(cls):
        """Chunks still to run: those of a failed or finished run never will."""
        return super().unfinished().filter(run__status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING])


class AuditRank(models.Model):
    """1-based ranks of a query's positives per modality for one retriever (None: not retrieved).

    ``mm``/``text``/``image`` hold the best rank over the positives (the labels use it);
    ``*_all`` the rank of every positive target (:func:`retrieval.targets.positive_targets`
    order; ``None`` for one missing from the gallery). ``graded`` holds the graded-only
    targets (CIRR's soft ones): ``{"gains": [...], "mm": [...], "text": [...], "image": [...]}``;
    ``subset`` the rank within the query's subset group (CIRR's img_set) per modality.
    ``reference_ahead`` (``{"mm": [...], "text": [...], "image": [...]}``, one boolean or
    ``None`` per positive) lets :mod:`retrieval.protocols` give the rank a protocol that
    keeps (or removes) the reference would give; empty for rows from before it or imported.
    Ties are pessimistic (see :mod:`retrieval.ranking`).
    """

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="ranks")
    query = models.ForeignKey(Query, on_delete=models.CASCADE, related_name="+")
    retriever = models.CharField(max_length=500)
    mm = models.PositiveIntegerField(null=True, blank=True)
    text = models.PositiveIntegerField(null=True, blank=True)
    image = models.PositiveIntegerField(null=True, blank=True)
    mm_all = models.JSONField(default=list, blank=True, help_text="Rank of every positive target (multimodal).")
    text_all = models.JSONField(default=list, blank=True, help_text="Rank of every positive target (text only).")
    image_all = models.JSONField(default=list, blank=True, help_text="Rank of every positive target (image only).")
    graded = models.JSONField(default=dict, blank=True, help_text="Gains and ranks of graded-only targets.")
    subset = models.JSONField(default=dict, blank=True, help_text="Rank within the query's subset group per modality.")
    top_mm = models.JSONField(
        default=list,
        blank=True,
        help_text="Image ids of the top AUDIT_CANDIDATES_N multimodal results, best first (targets and reference included).",
    )
    top_text = models.JSONField(
        default=list, blank=True, help_text="Image ids of the top AUDIT_CANDIDATES_N text-only results, best first."
    )
    top_image = models.JSONField(
        default=list, blank=True, help_text="Image ids of the top AUDIT_CANDIDATES_N image-only results, best first."
    )
    top_near = models.JSONField(
        default=list,
        blank=True,
        help_text="Image ids of the AUDIT_CANDIDATES_N images nearest the positive targets and the reference "
        "(image to image), best first.",
    )
    reference_ahead = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per modality, per positive (the *_all order): whether the reference scored >= it (protocols that keep it).",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "query", "retriever"], name="audit_rank_unique")]


class AuditSessionRank(models.Model):
    """Ranks ``r_1..r_L`` of a session's best ground truth after each turn (``None``: not retrieved).

    One row per retriever, history aggregation ``strategy`` (latest, average, weighted)
    and ``modality`` (multimodal, text_only, image_only); turn ``l`` ranks the
    aggregate of turns ``1..l`` (see :func:`retrieval.sessions.aggregate_history`).
    """

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="session_ranks")
    query = models.ForeignKey(Query, on_delete=models.CASCADE, related_name="+")
    retriever = models.CharField(max_length=500)
    strategy = models.CharField(max_length=10)
    modality = models.CharField(max_length=12)
    ranks = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "query", "retriever", "strategy", "modality"], name="audit_session_rank_unique"
            )
        ]


class AuditLabel(models.Model):
    """The audit's verdict on one query (see :mod:`audit.labels`)."""

    run = models.ForeignKey(AuditRun, on_delete=models.CASCADE, related_name="labels")
    query = models.ForeignKey(Query, on_delete=models.CASCADE, related_name="audit_labels")
    label = models.CharField(max_length=30)
    detail = models.CharField(max_length=30)
    legacy = models.CharField(max_length=30, blank=True)
    support_mm = models.PositiveIntegerField(default=0)
    support_text = models.PositiveIntegerField(default=0)
    support_image = models.PositiveIntegerField(default=0)
    support_either = models.PositiveIntegerField(default=0)
    best_mm = models.PositiveIntegerField(null=True, blank=True)
    best_text = models.PositiveIntegerField(null=True, blank=True)
    best_image = models.PositiveIntegerField(null=True, blank=True)
    best_retriever = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "query"], name="audit_label_unique")]
        indexes = [models.Index(fields=["run", "label"])]


class Leaderboard(models.Model):
    """Methods scored on one dataset split before and after cleaning (:mod:`audit.leaderboard`)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="leaderboards")
    split = models.CharField(max_length=50)
    name = models.CharField(max_length=100)
    metric = models.CharField(
        max_length=30, default="R@10", help_text="The protocol figure the table ranks by (R@10, mAP@10, Avg, ...)."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset__name", "split", "name"]
        constraints = [models.UniqueConstraint(fields=["dataset", "split", "name"], name="leaderboard_unique_name")]

    def __str__(self) -> str:
        return f"leaderboard {self.name} of {self.dataset_id}:{self.split}"


class LeaderboardEntry(models.Model):
    """One method of a leaderboard: its name, paper and per-query ranks, read from a prediction
    file, a rank file or an audit retriever (``ranks``: :func:`audit.leaderboard.entries.dump_ranks`)."""

    class Source(models.TextChoices):
        PREDICTIONS = "predictions"
        RANK_FILE = "rank_file"
        AUDIT = "audit"

    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="entries")
    name = models.CharField(max_length=200)
    paper = models.URLField(max_length=500, blank=True)
    source = models.CharField(max_length=12, choices=Source.choices)
    source_detail = models.CharField(max_length=1000, blank=True, help_text="The files or the audit and retriever.")
    ranks = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["leaderboard", "id"]
        constraints = [models.UniqueConstraint(fields=["leaderboard", "name"], name="leaderboard_entry_unique_name")]
