"""The CIR corpus: datasets, images, queries (sessions of one or more turns), targets.

One schema holds every public format without loss (see docs/CIR-FORMATS §9): a
single-turn query is a one-turn session, the verbatim source record is kept in
``Query.raw`` and ids are kept as the source spells them.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import models

from . import targets as target_rules
from .captions import DEFAULT_JOIN, join_captions
from .jobs.models import Job


class Dataset(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    format = models.CharField(max_length=20)
    description = models.TextField(blank=True)
    images_root = models.CharField(max_length=1000, blank=True, help_text="Folder the image paths are relative to.")
    extra = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Image(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="images")
    external_id = models.CharField(max_length=300)
    path = models.CharField(max_length=1000, blank=True, help_text="Relative to the dataset's images root.")
    url = models.URLField(max_length=1000, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    missing = models.BooleanField(default=False, help_text="No readable file on disk at import time.")
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "external_id"], name="image_unique_per_dataset")]
        indexes = [models.Index(fields=["dataset", "sha256"])]

    def __str__(self) -> str:
        return f"{self.dataset_id}:{self.external_id}"


class GalleryEntry(models.Model):
    """Membership of an image in a split's retrieval gallery."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="gallery")
    split = models.CharField(max_length=50)
    image = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="galleries")
    ordinal = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "split", "image"], name="gallery_unique_member")]
        indexes = [models.Index(fields=["dataset", "split", "ordinal"])]


class Query(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="queries")
    external_id = models.CharField(max_length=300)
    split = models.CharField(max_length=50)
    category = models.CharField(max_length=100, blank=True)
    ordinal = models.PositiveIntegerField(default=0)
    source_file = models.CharField(max_length=500, blank=True)
    n_turns = models.PositiveSmallIntegerField(default=1)
    context_text = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    raw = models.JSONField(default=dict, blank=True, help_text="The verbatim source record.")
    extra = models.JSONField(default=dict, blank=True)
    content_hash = models.CharField(
        max_length=64,
        blank=True,
        help_text="Digest of the normalised record, turns and targets; a re-import rewrites the query only when it changes.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["dataset", "split", "external_id"], name="query_unique_per_split")
        ]
        indexes = [models.Index(fields=["dataset", "n_turns"])]
        verbose_name_plural = "queries"

    def __str__(self) -> str:
        return f"{self.dataset_id}:{self.split}:{self.external_id}"

    def positive_targets(self, targets: Iterable[Target] | None = None) -> list[Target]:
        """The targets that count for this query, by the one target rule of its dataset's format
        (:func:`retrieval.targets.positive_targets`), in input order. ``targets`` defaults to
        ``self.targets.all()`` (prefetched ones are used)."""
        return target_rules.positive_targets(self.dataset.format, self.targets.all() if targets is None else targets)


CAPTION_ROLES = ("caption", "generated")


def turn_captions(texts: list[dict]) -> list[str]:
    """The modification texts of a turn (not the auxiliary ones such as CIRR's caption_ext)."""
    return [t["text"] for t in texts or () if t.get("role", "caption") in CAPTION_ROLES]


def turn_text(texts: list[dict], join: str = DEFAULT_JOIN) -> str:
    """A turn's modification text as one string: several captions are joined as ``join``
    says (:mod:`retrieval.captions`; CIRVal's: stripped, non-empty, joined with ' and ')."""
    return join_captions(turn_captions(texts), join)


class Turn(models.Model):
    query = models.ForeignKey(Query, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveSmallIntegerField(help_text="1-based")
    reference_image = models.ForeignKey(Image, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    texts = models.JSONField(default=list, help_text="[{text, role, annotator, key}] as in the source")
    turn_target = models.ForeignKey(Image, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    provenance = models.CharField(max_length=50, default="human")
    reference_turns = models.JSONField(
        default=list,
        blank=True,
        help_text="Earlier turns whose images form this turn's effective reference (rollback: one, "
        "combination: several); empty: its own reference image (retrieval.sessions).",
    )
    reference_checks = models.JSONField(
        default=list,
        blank=True,
        help_text="Automatic reference checks the turn fails (retrieval.sessions.REFERENCE_CHECKS)",
    )

    class Meta:
        ordering = ["query", "index"]
        constraints = [models.UniqueConstraint(fields=["query", "index"], name="turn_unique_index")]

    @property
    def captions(self) -> list[str]:
        return turn_captions(self.texts)

    @property
    def text(self) -> str:
        """The modification text as one string: several captions are joined with ' and '."""
        return turn_text(self.texts)


class Target(models.Model):
    query = models.ForeignKey(Query, on_delete=models.CASCADE, related_name="targets")
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="+")
    relevance = models.FloatField(default=1.0)
    is_primary = models.BooleanField(default=False)
    role = models.CharField(max_length=20, default="gt")
    source_field = models.CharField(max_length=100, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["query", "image"], name="target_unique_image")]


#: The subset a study export writes and the audit report reads: the queries annotators validated.
VALIDATED_SUBSET = "validated"


class QuerySubset(models.Model):
    """A named list of queries handed from one stage to the next ("shortcut_free", "validated")."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="subsets")
    name = models.CharField(max_length=100)
    source = models.CharField(max_length=200, blank=True, help_text="What wrote it, e.g. 'audit 3' or 'study 2 export'")
    queries = models.ManyToManyField(Query, related_name="subsets", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "name"], name="subset_unique_name")]


class ImportJob(Job):
    """An import started from the browser; large ones run on a worker and report progress."""

    dataset_name = models.SlugField(max_length=100)
    format = models.CharField(max_length=20)
    split = models.CharField(max_length=50, blank=True)
    images_root = models.CharField(max_length=1000, blank=True)
    files = models.JSONField(default=list, help_text="Stored upload paths")
    delete_removed = models.BooleanField(
        default=False, help_text="A re-import deletes the stored records its files no longer hold (else it refuses)."
    )
    report = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
