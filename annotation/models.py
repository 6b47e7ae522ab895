"""Studies, items, assignments, judgements (every revision kept) and drafts."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from annotation.core.consensus import DEFAULT_CONFIDENCE, QuorumRule
from annotation.core.rounds import InteractiveSettings
from annotation.core.rubric import Rubric, builtin_rubric
from annotation.core.serving import SERVE_RANDOM, SERVE_SUSPICION
from annotation.core.study_settings import (
    EstimateSettings,
    GoldSettings,
    QuorumSettings,
    ServingSettings,
    column_problems,
)
from retrieval.jobs.models import Job
from retrieval.models import Query

#: Parsed rubrics by the text of their definition: every request reads its study's rubric
#: from a fresh row, and parsing it (:meth:`Rubric.from_dict`, about 0.1 ms) is several times
#: reading the key. A Rubric is immutable, so one parse serves every row with that definition.
_PARSED_RUBRICS: dict[str, Rubric] = {}
_PARSED_RUBRICS_MAX = 64


def parsed_rubric(definition: dict) -> Rubric:
    """:meth:`Rubric.from_dict` of ``definition``, parsed once per process per definition."""
    key = repr(definition)
    found = _PARSED_RUBRICS.get(key)
    if found is None:
        found = Rubric.from_dict(definition)
        if len(_PARSED_RUBRICS) >= _PARSED_RUBRICS_MAX:
            _PARSED_RUBRICS.clear()
        _PARSED_RUBRICS[key] = found
    return found


class RubricVersion(models.Model):
    """A versioned rubric definition; judgements point at the version they were made under."""

    key = models.SlugField(max_length=50)
    version = models.PositiveIntegerField()
    title = models.CharField(max_length=200)
    definition = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "version"], name="rubric_unique_version")]
        ordering = ["key", "-version"]

    def __str__(self) -> str:
        return f"{self.key} v{self.version}"

    @cached_property
    def rubric(self) -> Rubric:
        return parsed_rubric(self.definition)

    @classmethod
    def builtin(cls, key: str, version: int | None = None) -> RubricVersion:
        """The stored copy of a shipped rubric, ``version`` or the newest (created on first use)."""
        rubric = builtin_rubric(key, version)
        obj, _ = cls.objects.get_or_create(
            key=rubric.key, version=rubric.version, defaults={"title": rubric.title, "definition": rubric.to_dict()}
        )
        return obj


class Study(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        PAUSED = "paused"
        CLOSED = "closed"

    name = models.CharField(max_length=200, unique=True)
    rubric = models.ForeignKey(RubricVersion, on_delete=models.PROTECT, related_name="studies")
    overlap = models.PositiveSmallIntegerField(default=3, help_text="Annotators per item.")
    quorum = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Current judgements an item needs before consensus decides it (empty: the overlap).",
    )
    adaptive_max = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Adaptive overlap: serve each item to `overlap` annotators and, while they disagree, to one more "
        "up to this many (empty: a fixed overlap).",
    )
    consensus = models.CharField(
        max_length=12,
        default="majority",
        choices=[("majority", "majority"), ("reliability", "reliability-weighted (Dawid-Skene)")],
        help_text="The consensus policy pages and exports use unless told another.",
    )
    adaptive_confidence = models.FloatField(
        default=DEFAULT_CONFIDENCE,
        validators=[MinValueValidator(0.5), MaxValueValidator(1.0)],
        help_text="Adaptive overlap under reliability-weighted consensus: a split is decided without a further "
        "annotator once the annotators' reliability (Dawid-Skene on the study's judgements so far) makes "
        "it at least this sure either way (0.5 to 1).",
    )
    reliability_fit = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="The last Dawid-Skene fit serving reads (annotation.verdicts.refit): the binary model, the "
        "judgements it was fitted on (count, last id) and when; refitted in a worker, empty before the first.",
    )
    refit_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the refit of reliability_fit that was asked for is due (at most one pending per study); empty: none pending.",
    )
    session_rule = models.JSONField(
        default=dict,
        blank=True,
        help_text="Session studies: how a session is decided (reject rule, overall threshold); empty: the default.",
    )
    blind = models.BooleanField(default=True, help_text="Hide audit ranks from annotators.")
    guidelines = models.TextField(blank=True)
    lease_minutes = models.PositiveSmallIntegerField(default=10, help_text="How long a served item stays reserved.")
    seed = models.IntegerField(default=0)
    candidates = models.PositiveSmallIntegerField(
        default=20,
        validators=[MinValueValidator(0), MaxValueValidator(50)],
        help_text="Candidate images shown per single-turn item (0 to 50), the same number for every item.",
    )

    class ServeOrder(models.TextChoices):
        RANDOM = SERVE_RANDOM, "random (the study's seeded shuffle)"
        SUSPICION = SERVE_SUSPICION, "suspicion, highest first"

    serve_order = models.CharField(
        max_length=10,
        choices=ServeOrder.choices,
        default=ServeOrder.RANDOM,
        help_text="Which fresh item an annotator gets first: the seeded shuffle, or the most suspicious "
        "(audit/suspicion.py; staff only, annotators are never told).",
    )
    alternatives_rule = models.CharField(
        max_length=10,
        default="majority",
        choices=[("majority", "strict majority"), ("unanimous", "unanimous")],
        help_text="When a ticked candidate becomes an extra ground truth.",
    )
    pool = models.JSONField(default=dict, blank=True, help_text="How the item pool was drawn (reproducible).")
    annotators = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="studies", blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    gold_rate = models.FloatField(default=0.05, help_text="Share of each annotator's queue drawn from gold items.")
    training_items = models.PositiveSmallIntegerField(
        default=0, help_text="Gold items (with feedback) each annotator judges before real items."
    )
    too_fast_seconds = models.FloatField(default=5.0, help_text="Judgements faster than this are flagged to staff.")
    straight_run = models.PositiveSmallIntegerField(
        default=8, help_text="This many identical answers in a row are flagged to staff as straight-lining."
    )
    interactive = models.JSONField(
        default=dict,
        blank=True,
        help_text="Interactive studies (the annotator plays the user): retriever, top_n, max_rounds, strategy, "
        "target_view (annotation.core.rounds.InteractiveSettings); empty: not interactive.",
    )
    estimate = models.JSONField(
        default=dict,
        blank=True,
        help_text="Estimate studies (issue 40): a stratified sample of the benchmark, served in a Neyman plan, "
        "estimates each defect kind's prevalence (annotation.studies.estimating): target half-width, "
        "strata, the plan's state and the stop; empty: not an estimate study. Staff only.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The study's sizes (annotation.sizes), kept with every change of its items, their
    # agreement flags and extra slots, and its annotators, so "next item" reads them with the
    # study row (issue 30: no count of the items per request). Written only by their keepers:
    # a plain save() leaves them alone (save below).
    n_items = models.PositiveIntegerField(default=0, editable=False, help_text="Items in the study.")
    n_agreement = models.PositiveIntegerField(default=0, editable=False, help_text="Items in the agreement subset.")
    n_extra_slots = models.PositiveIntegerField(
        default=0, editable=False, help_text="The items' extra slots together (StudyItem.extra_slots)."
    )
    n_annotators = models.PositiveIntegerField(default=0, editable=False, help_text="The study's annotators.")

    SIZE_FIELDS = ("n_items", "n_agreement", "n_extra_slots", "n_annotators")
    #: Fields only ever written by targeted UPDATEs (sizes; the reliability refit worker's fit
    #: and its pending flag; an estimate study's plan and stop), never by a plain save of a copy
    #: that may be older.
    KEPT_FIELDS = SIZE_FIELDS + ("reliability_fit", "refit_requested_at", "estimate")

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "studies"

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """A save of a stored study writes every field but :data:`KEPT_FIELDS` (its sizes, its
        stored reliability fit and refit flag, its estimate state): the copy in memory may be older than what a
        concurrent change counted or a worker fitted."""
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name not in self.KEPT_FIELDS
            ]
        super().save(*args, **kwargs)

    def clean(self) -> None:
        """Every setting group's rules (annotation.core.study_settings), setting by setting: the
        settings page, the admin; building a study checks the same groups."""
        super().clean()
        problems = column_problems(self)
        try:
            if self.interactive:
                InteractiveSettings.from_dict(self.interactive)  # checks itself when built
        except (TypeError, ValueError) as exc:
            problems["interactive"] = f"interactive settings: {exc}"
        try:
            if self.estimate:
                EstimateSettings.parse(self.estimate).validate()
        except ValueError as exc:
            problems["estimate"] = str(exc)
        if problems:
            raise ValidationError(problems)

    # The study's settings in typed groups (annotation.core.study_settings), built from the columns.
    @property
    def quorum_settings(self) -> QuorumSettings:
        return QuorumSettings.of(self)

    @property
    def gold_settings(self) -> GoldSettings:
        return GoldSettings.of(self)

    @property
    def serving_settings(self) -> ServingSettings:
        return ServingSettings.of(self)

    @property
    def interactive_settings(self) -> InteractiveSettings | None:
        """An interactive study's settings; ``None``: not interactive."""
        return InteractiveSettings.from_dict(self.interactive) if self.interactive else None

    @property
    def estimate_settings(self) -> EstimateSettings | None:
        """An estimate study's sampling target; ``None``: not an estimate study."""
        return EstimateSettings.parse(self.estimate) if self.estimate else None

    @property
    def quorum_rule(self) -> QuorumRule:
        """THE quorum rule of the study (:class:`annotation.core.consensus.QuorumRule`); under
        reliability-weighted consensus an adaptive rule settles splits at ``adaptive_confidence``
        once bound to the study's reliability model (``annotation.verdicts.readmodel.quorum_rule_of``)."""
        return self.quorum_settings.rule

    @property
    def kind(self) -> str:
        """What the annotators do: ``interactive`` (they write sessions), else the rubric's kind."""
        return "interactive" if self.interactive else self.rubric.rubric.kind

    @property
    def estimate_stopped(self) -> bool:
        """An estimate study whose stop rule was met: no fresh item is served any more."""
        return bool((self.estimate or {}).get("stopped"))

    @property
    def decision_quorum(self) -> int:
        """Counted judgements an item needs before it is decided: the quorum, else the overlap."""
        return self.quorum_rule.base


class GuidelinesVersion(models.Model):
    """Every saved text of a study's guidelines (Markdown), with the rubric it was written for."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="guideline_versions")
    rubric = models.ForeignKey(RubricVersion, on_delete=models.PROTECT, related_name="+")
    version = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["study", "version"], name="guidelines_unique_version")]
        ordering = ["study", "-version"]


class StudyItem(models.Model):
    """One query in a study's pool. ``taken`` = judged + currently reserved slots."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="items")
    query = models.ForeignKey(Query, on_delete=models.PROTECT, related_name="study_items")
    hidden_category = models.CharField(max_length=50, blank=True, help_text="Audit label; never shown to annotators.")
    stratum = models.CharField(max_length=200, blank=True)
    agreement = models.BooleanField(default=False, help_text="In the agreement subset: judged by everyone.")
    order_key = models.PositiveIntegerField(default=0)
    taken = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    extra_slots = models.PositiveSmallIntegerField(
        default=0,
        help_text="Annotators beyond the study's overlap this item is open to: what an adaptive quorum "
        "rule opened for its counted votes (Study.quorum_rule.slots less the overlap).",
    )
    gold = models.BooleanField(default=False, help_text="A gold item: served to everyone at the study's gold rate.")
    gold_answer = models.JSONField(default=dict, blank=True, help_text='The known answer, e.g. {"validated": true}.')
    gold_source = models.CharField(max_length=20, blank=True, help_text="hand, adjudicated or unanimous.")
    candidates = models.JSONField(
        default=list, blank=True, help_text="The item's candidate panel (image ids), fixed once first shown."
    )
    candidates_source = models.CharField(
        max_length=200, blank=True, help_text="Where the panel came from (staff only)."
    )
    suspicion = models.FloatField(default=0.0, help_text="Suspicion score in [0, 1] (audit/suspicion.py; staff only).")
    suspicion_parts = models.JSONField(
        default=dict, blank=True, help_text="The score's parts and the run they came from (staff only)."
    )
    estimate_stratum = models.SmallIntegerField(
        null=True,
        blank=True,
        help_text="Estimate studies: the suspicion stratum (0 = lowest scores), fixed when "
        "the study was planned (staff only).",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["study", "query"], name="studyitem_unique_query")]
        indexes = [
            models.Index(fields=["study", "-agreement", "-taken", "order_key"], name="studyitem_queue"),
            # The same queue served by suspicion (Study.serve_order), highest first.
            models.Index(
                fields=["study", "-agreement", "-taken", "-suspicion", "order_key"], name="studyitem_suspicion_queue"
            ),
            # The gold choice (annotation.assignment.queue._gold_choice) and the gold count of
            # "next item": gold rows only, in serving order, so neither scans the study.
            models.Index(fields=["study", "order_key", "id"], condition=models.Q(gold=True), name="studyitem_gold"),
        ]

    def __str__(self) -> str:
        return f"{self.study_id}:{self.query_id}"


class Assignment(models.Model):
    """An item served to one annotator; at most one per (item, annotator)."""

    class Status(models.TextChoices):
        RESERVED = "reserved"
        DONE = "done"
        SKIPPED = "skipped"
        RELEASED = "released"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="assignments")
    item = models.ForeignKey(StudyItem, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RESERVED)
    served_by = models.CharField(max_length=40, blank=True, help_text="The rule that served the item.")
    position = models.PositiveIntegerField(default=0, help_text="Order in the annotator's queue.")
    leased_at = models.DateTimeField(null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["item", "annotator"], name="assignment_once_per_annotator")]
        indexes = [
            models.Index(fields=["study", "annotator", "status"], name="assignment_mine"),
            models.Index(fields=["study", "status", "lease_expires"], name="assignment_leases"),
        ]
        ordering = ["position", "id"]


def counted_q(prefix: str = "") -> Q:
    """The condition of a judgement that counts (see :meth:`JudgementQuerySet.counted`), for a
    query that reaches judgements through ``prefix`` (e.g. ``"assignments__revisions__"``)."""
    return Q(**{f"{prefix}is_current": True, f"{prefix}late": False})


class JudgementQuerySet(models.QuerySet):
    def counted(self):
        """THE judgements that count (agreement, consensus, gold, quality, alternatives,
        progress, shares and exports): the current revision of each, less late ones (an item
        gone to someone else is counted once). :mod:`annotation.verdicts.state` reads them."""
        return self.filter(counted_q())


class Judgement(models.Model):
    """One revision of an annotator's judgement; the latest is ``is_current``."""

    objects = JudgementQuerySet.as_manager()

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="revisions")
    rubric = models.ForeignKey(RubricVersion, on_delete=models.PROTECT, related_name="+")
    revision = models.PositiveIntegerField(default=1)
    is_current = models.BooleanField(default=True)
    category = models.CharField(max_length=50, blank=True)
    sub_reason = models.CharField(max_length=50, blank=True)
    note = models.TextField(blank=True)
    flags = models.JSONField(default=dict, blank=True, help_text="One boolean per invalid category.")
    validated = models.BooleanField(null=True)
    flagged = models.BooleanField(default=False, help_text="Sent to adjudication by the annotator.")
    time_spent_ms = models.PositiveIntegerField(default=0)
    scales = models.JSONField(default=dict, blank=True)
    per_turn = models.JSONField(default=list, blank=True)
    reject_flags = models.JSONField(default=list, blank=True)
    alternatives = models.JSONField(
        default=list, blank=True, help_text="Candidate image ids that fit as well as the labelled target."
    )
    none_fit = models.BooleanField(
        default=False, help_text="The annotator said that none of the candidates fits (no tick by choice)."
    )
    client_token = models.CharField(max_length=64, blank=True, help_text="Idempotency key sent by the client.")
    late = models.BooleanField(
        default=False,
        help_text="Submitted after the lease expired and the item went to someone else: kept, "
        "but not counted towards the item's quorum.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["assignment", "revision"], name="judgement_unique_revision"),
            models.UniqueConstraint(fields=["assignment"], condition=Q(is_current=True), name="judgement_one_current"),
            models.UniqueConstraint(
                fields=["assignment", "client_token"], condition=~Q(client_token=""), name="judgement_unique_token"
            ),
        ]
        ordering = ["assignment", "revision"]


class Draft(models.Model):
    """Autosaved, unsubmitted state of an item so a reload loses nothing."""

    assignment = models.OneToOneField(Assignment, on_delete=models.CASCADE, related_name="draft")
    payload = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)


class Adjudication(models.Model):
    """A staff decision on an item (a tie or a flagged item). Every decision is kept;
    the latest is ``is_current`` and overrides the consensus policy for that item."""

    class Decision(models.TextChoices):
        VALIDATED = "validated"
        REJECTED = "rejected"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="adjudications")
    item = models.ForeignKey(StudyItem, on_delete=models.CASCADE, related_name="adjudications")
    decision = models.CharField(max_length=10, choices=Decision.choices)
    note = models.TextField(blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    decided_at = models.DateTimeField(auto_now_add=True)
    is_current = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item"], condition=Q(is_current=True), name="adjudication_one_current"),
        ]
        indexes = [models.Index(fields=["study", "item"], name="adjudication_item")]
        ordering = ["item", "-decided_at", "-id"]

    def __str__(self) -> str:
        return f"{self.item_id}: {self.decision}"

    @property
    def validated(self) -> bool:
        return self.decision == self.Decision.VALIDATED


class AlternativeDecision(models.Model):
    """An adjudicator's decision on one candidate of an item: accepted as an extra ground
    truth or not, whatever the votes. The latest per (item, image) is current."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="alternative_decisions")
    item = models.ForeignKey(StudyItem, on_delete=models.CASCADE, related_name="alternative_decisions")
    image_id = models.PositiveBigIntegerField()
    accepted = models.BooleanField()
    note = models.TextField(blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["item", "image_id"], name="altdecision_item_image")]
        ordering = ["item", "image_id", "-decided_at", "-id"]


class InteractiveSession(models.Model):
    """A session an annotator writes in an interactive study: one per assignment; its rounds
    are :class:`InteractiveRound` rows. ``outcome``: found (the target reached the top N),
    rounds (R rounds passed without it) or empty while the session goes on."""

    FOUND = "found"
    OUT_OF_ROUNDS = "rounds"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="interactive_sessions")
    assignment = models.OneToOneField(Assignment, on_delete=models.CASCADE, related_name="interactive_session")
    item = models.ForeignKey(StudyItem, on_delete=models.CASCADE, related_name="interactive_sessions")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    config = models.JSONField(default=dict, help_text="The study's interactive settings when the session began.")
    outcome = models.CharField(max_length=10, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["study", "id"]

    def __str__(self) -> str:
        return f"session {self.pk} of study {self.study_id}"


class InteractiveRound(models.Model):
    """One round: the feedback text the annotator typed about ``reference`` (the query's
    reference image in round 1, the candidate they picked afterwards), and what the worker's
    re-ranking gave back: the candidates shown (image ids, best first) and the target's rank."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    #: A pending round waits for a worker: ``/healthz`` counts it (retrieval.jobs.workers.waiting_jobs).
    waits_for_worker = True

    session = models.ForeignKey(InteractiveSession, on_delete=models.CASCADE, related_name="rounds")
    index = models.PositiveSmallIntegerField(help_text="1-based.")
    text = models.TextField()
    reference = models.ForeignKey("retrieval.Image", on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=10, default=PENDING)
    shown = models.JSONField(
        default=list, blank=True, help_text="Candidate image ids shown after the round, best first."
    )
    target_rank = models.PositiveIntegerField(null=True, blank=True, help_text="1-based; empty: not ranked.")
    error = models.TextField(blank=True)
    rank_ms = models.FloatField(null=True, blank=True, help_text="The worker's re-ranking time.")
    time_spent_ms = models.PositiveIntegerField(default=0, help_text="Writing time the page measured.")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="Last sent to a worker (the sweep resends).")
    ranked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "index"], name="interactive_round_once")]
        ordering = ["session", "index"]

    @classmethod
    def unfinished(cls):
        """Rounds a worker still has to re-rank."""
        return cls.objects.filter(status=cls.PENDING)


class ExportJob(Job):
    """A validated-JSONL export of a study, run by a worker; progress is items done / total."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="exports")
    policy = models.CharField(max_length=20, default="majority")
    primary = models.CharField(max_length=150, blank=True, help_text="Deciding annotator of the primary policy.")
    query_format = models.CharField(
        max_length=10,
        default="mbeir",
        help_text="Query files of a category study: mbeir (JSONL) or circo (CIRCO's layout).",
    )
    sessions = models.CharField(
        max_length=10,
        default="whole",
        help_text="Sessions judged turn by turn: whole (valid sessions) or prefix (valid prefixes too).",
    )
    path = models.CharField(max_length=1000, blank=True, help_text="The finished export folder.")
    files = models.JSONField(default=list, blank=True, help_text="Paths relative to the export folder.")
    manifest = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"export {self.pk} of study {self.study_id} ({self.status})"

    @property
    def folder_name(self) -> str:
        """The export folder's name, what pages show (never the server's absolute path)."""
        return Path(self.path).name if self.path else ""


class ReleaseJob(Job):
    """A release of one or more studies (:func:`annotation.release.bundle.build_release`), run by
    a worker; the staff page's "Make a release" button creates it."""

    study = models.ForeignKey(
        Study,
        on_delete=models.CASCADE,
        related_name="releases",
        help_text="The study whose page started it (the first of study_ids).",
    )
    study_ids = models.JSONField(default=list, help_text="The studies released, in order.")
    layouts = models.JSONField(default=list, blank=True, help_text="Layouts asked for (empty: each study's default).")
    path = models.CharField(
        max_length=1000, blank=True, help_text="The finished release folder (the zip is beside it)."
    )
    files = models.JSONField(default=list, blank=True, help_text="Paths relative to the release folder.")
    placeholders = models.JSONField(default=list, blank=True, help_text="Fields the publisher must fill in.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"release {self.pk} of studies {self.study_ids} ({self.status})"

    @property
    def folder_name(self) -> str:
        """The release folder's name: pages show it, never the server path."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] if self.path else ""

    @property
    def zip_name(self) -> str:
        return self.folder_name + ".zip" if self.path else ""


class RoomImportJob(Job):
    """A staff project room import of rank files (``import_ranks``) or of a CIRCUS study
    (``import_circus``), run by a worker (:func:`annotation.room.imports.run_room_import_job`):
    the request only stores the uploads and queues it; the uploads are deleted when it ends."""

    RANKS = "import_ranks"
    CIRCUS = "import_circus"

    command = models.CharField(max_length=20, choices=[(RANKS, RANKS), (CIRCUS, CIRCUS)])
    options = models.JSONField(default=dict, blank=True, help_text="The form's fields, as the command's options.")
    paths = models.JSONField(default=list, blank=True, help_text="The stored uploads (deleted when the job ends).")
    names = models.JSONField(default=list, blank=True, help_text="The files' names as uploaded.")
    lines = models.JSONField(default=list, blank=True, help_text="What the command prints.")
    warnings = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.command} {self.pk} ({self.status})"
