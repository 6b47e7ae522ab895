from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from annotation.core.rounds import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_STRATEGY,
    DEFAULT_TOP_N,
    MAX_ROUNDS_LIMIT,
    MAX_TOP_N,
    TARGET_VIEWS,
)
from annotation.core.rubric import builtin_rubrics
from annotation.core.study_settings import MAX_LEASE_MINUTES, MAX_OVERLAP, QuorumSettings, ServingSettings
from annotation.models import Study
from annotation.studies.building import StudySpec
from audit.labels import COMPOSITION_REQUIRED, LABELS, UNRESOLVED
from config.parsing import HostileInput, loads
from retrieval.fusion import MAX_CANDIDATES
from retrieval.models import Dataset
from retrieval.sessions import STRATEGIES


class StudyForm(forms.Form):
    name = forms.CharField(max_length=200)
    datasets = forms.ModelMultipleChoiceField(queryset=Dataset.objects.all(), to_field_name="name")
    rubric = forms.ChoiceField(choices=[(k, r.title) for k, r in builtin_rubrics().items()])
    overlap = forms.IntegerField(min_value=1, max_value=MAX_OVERLAP, initial=3, help_text="Annotators per item.")
    quorum = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_OVERLAP,
        help_text="Current judgements an item needs before it is decided (validated, rejected or sent to "
        "adjudication); empty: the overlap. Items below it are pending and never exported.",
    )
    adaptive_max = forms.IntegerField(
        required=False,
        min_value=2,
        max_value=MAX_OVERLAP,
        label="Adaptive overlap: at most",
        help_text="Serve each item to the overlap (e.g. 2) and, only while its annotators disagree, to one more "
        "up to this many (e.g. 3); empty: every item goes to the overlap.",
    )
    consensus = forms.ChoiceField(
        required=False,
        choices=[("majority", "majority"), ("reliability", "reliability-weighted (Dawid-Skene)")],
        initial="majority",
        help_text="How pages and exports decide an item by default; reliability-weighted consensus lets a reliable "
        "annotator outweigh unreliable ones, and is shown beside the majority wherever they differ.",
    )
    serve_order = forms.ChoiceField(
        required=False,
        choices=Study.ServeOrder.choices,
        initial=Study.ServeOrder.RANDOM,
        label="Serve fresh items by",
        help_text="Suspicion: the most suspicious fresh item first (scores from the newest audit; staff see them on the "
        "study's suspicion page, annotators never do). Empty: random.",
    )
    session_reject = forms.ChoiceField(
        required=False,
        choices=[("majority", "majority of reject flags"), ("any", "any reject flag")],
        initial="majority",
        label="Session rule: reject when",
        help_text="Session rubrics only: a session is rejected when strictly more than half of its votes (or any "
        "vote) raise a reject flag.",
    )
    session_threshold = forms.FloatField(
        required=False,
        initial=3.0,
        min_value=1,
        max_value=5,
        label="Session rule: median overall at least",
        help_text="Session rubrics only: otherwise a session is validated when the median overall score reaches this.",
    )
    hidden_categories = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        choices=[(label, label) for label in LABELS],
        help_text="Draw the pool from these audit labels (leave empty for all queries).",
    )
    quotas = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=f'Optional JSON quotas per stratum, e.g. {{"demo::{UNRESOLVED}": 20, "demo::{COMPOSITION_REQUIRED}": 30}}.',
    )
    total = forms.IntegerField(required=False, min_value=1, help_text="Or a total, split over strata by size.")
    seed = forms.IntegerField(initial=0, min_value=-(2**31), max_value=2**31 - 1)
    agreement_size = forms.IntegerField(min_value=0, initial=0, help_text="Items judged by every annotator.")
    blind = forms.BooleanField(required=False, initial=True)
    lease_minutes = forms.IntegerField(min_value=1, max_value=MAX_LEASE_MINUTES, initial=10)
    candidates = forms.IntegerField(
        min_value=0,
        max_value=MAX_CANDIDATES,
        initial=20,
        required=False,
        help_text="Candidate images per item, the same number for every item (on pages of 10); empty: 20.",
    )
    guidelines = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}))
    interactive = forms.BooleanField(
        required=False,
        label="Interactive: the annotators play the user and write sessions",
        help_text="Each single-turn query's target is shown; the annotator types feedback, a worker re-ranks, "
        "round after round (the rubric then only names how the sessions are judged later).",
    )
    interactive_retriever = forms.CharField(
        required=False,
        label="Interactive: retriever",
        help_text="A retriever spec; empty: the dataset's newest audited one.",
    )
    interactive_top_n = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_TOP_N,
        initial=DEFAULT_TOP_N,
        label="Interactive: found within the top N",
    )
    interactive_max_rounds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_ROUNDS_LIMIT,
        initial=DEFAULT_MAX_ROUNDS,
        label="Interactive: at most R rounds",
    )
    interactive_strategy = forms.ChoiceField(
        required=False,
        choices=[(s, s) for s in STRATEGIES],
        initial=DEFAULT_STRATEGY,
        label="Interactive: history of the rounds",
    )
    interactive_target_view = forms.ChoiceField(
        required=False,
        choices=[(v, v) for v in TARGET_VIEWS],
        initial="image",
        label="Interactive: the target is shown as",
    )
    annotators = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.filter(groups__name="annotator").order_by("username"),
        to_field_name="username",
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )

    def clean_quotas(self):
        raw = self.cleaned_data["quotas"].strip()
        if not raw:
            return None
        try:
            data = loads(raw)
        except HostileInput as exc:
            raise forms.ValidationError(str(exc)) from None
        if not isinstance(data, dict) or not all(isinstance(v, int) and v >= 0 for v in data.values()):
            raise forms.ValidationError("Quotas are an object of non-negative integers.")
        return data

    def clean(self):
        """The quorum and serving settings' rules together (annotation.core.study_settings), each
        problem on its field, once every field of the group has parsed."""
        data = super().clean()
        values = self._group_values(data)
        for group in (QuorumSettings, ServingSettings):
            if any(name in self.errors for name in group.field_names()):
                continue
            for name, problem in group.from_values(values).problems().items():
                self.add_error(name if name in self.fields else None, problem)
        return data

    @staticmethod
    def _group_values(d: dict) -> dict:
        """The quorum and serving settings asked for; an empty choice or number is left out
        (the study's default: e.g. 20 candidates, majority consensus, random order)."""
        names = (*QuorumSettings.field_names(), *ServingSettings.field_names())
        return {k: d[k] for k in names if k in d and (d[k] not in (None, "") or k in ("quorum", "adaptive_max"))}

    def spec(self) -> StudySpec:
        d = self.cleaned_data
        return StudySpec(
            name=d["name"],
            datasets=[x.name for x in d["datasets"]],
            rubric=d["rubric"],
            hidden_categories=list(d["hidden_categories"]),
            quotas=d["quotas"],
            total=d["total"],
            seed=d["seed"],
            agreement_size=d["agreement_size"],
            guidelines=d["guidelines"],
            annotators=[u.username for u in d["annotators"]],
            session_rule=self._session_rule(d),
            interactive=self._interactive(d),
            **self._group_values(d),
        )

    @staticmethod
    def _interactive(d: dict) -> dict | None:
        if not d.get("interactive"):
            return None
        out = {
            "retriever": (d.get("interactive_retriever") or "").strip(),
            "top_n": d.get("interactive_top_n") or DEFAULT_TOP_N,
            "max_rounds": d.get("interactive_max_rounds") or DEFAULT_MAX_ROUNDS,
            "strategy": d.get("interactive_strategy") or DEFAULT_STRATEGY,
            "target_view": d.get("interactive_target_view") or "image",
        }
        return {k: v for k, v in out.items() if v != ""}

    @staticmethod
    def _session_rule(d: dict) -> dict | None:
        if d["rubric"] != "session":
            return None
        return {"reject": d.get("session_reject") or "majority", "threshold": d.get("session_threshold") or 3.0}
