"""The 'New audit' form (staff)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from retrieval.models import Dataset

from .models import AuditRun
from .runs.base import AuditError
from .runs.planning import normalise_retrievers, resolve_split

DEFAULT_POOL = "openclip:cirval-tiny-vit\nopenclip:cirval-tiny-vit-b"


def default_pool() -> str:
    """The pool the form starts with: that of the newest finished computed audit (the demo's
    trained retrievers on a fresh install), else two tiny configurations with random weights."""
    last = (
        AuditRun.objects.filter(status=AuditRun.Status.DONE, source=AuditRun.Source.COMPUTED)
        .order_by("-pk")
        .values_list("retrievers", flat=True)
        .first()
    )
    return "\n".join(last) if last else DEFAULT_POOL


class AuditForm(forms.Form):
    dataset = forms.ModelChoiceField(Dataset.objects.all(), to_field_name="name", empty_label=None)
    split = forms.CharField(
        required=False,
        max_length=50,
        help_text="A split (val) or a category of one (dress/val). Empty: the dataset's only split.",
    )
    retrievers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        initial=default_pool,
        help_text="One retriever spec a line: a pretrained tag (openclip:ViT-B-32@openai) or a checkpoint "
        "(openclip:ViT-B-32@/models/ft.pt). A spec without weights (openclip:cirval-tiny-vit) is "
        "initialised at random: its ranks mean nothing (tests only).",
    )
    k = forms.IntegerField(label="K", min_value=1, max_value=1000, initial=10)
    min_mm_retrievers = forms.IntegerField(
        label="Minimum retrievers within K (multimodal)",
        min_value=0,
        initial=1,
        help_text="How many retrievers must solve a query multimodally for composition_required.",
    )
    exclude_reference = forms.BooleanField(
        required=False, initial=True, label="Leave each query's reference image out of its gallery"
    )
    epsilon = forms.FloatField(
        label="Sessions: epsilon",
        required=False,
        min_value=0,
        help_text="Epsilon-consistency margin: a rank may worsen by at most this much per turn (empty: 30).",
    )
    tau = forms.FloatField(
        label="Sessions: tau",
        required=False,
        min_value=-1,
        max_value=1,
        help_text="Tau-diversity: two texts of a session with cosine >= tau remove it (empty: 0.8).",
    )
    tau_encoder = forms.CharField(
        label="Sessions: tau text encoder",
        required=False,
        max_length=500,
        help_text="Retriever spec whose text encoder the tau filter uses (empty: the first retriever).",
    )

    def clean(self):
        data = super().clean()
        dataset = data.get("dataset")
        if dataset is not None:
            try:
                data["split"] = resolve_split(dataset, data.get("split") or None)
            except AuditError as exc:
                self.add_error("split", str(exc))
        if (data.get("tau_encoder") or "").strip():
            try:
                data["tau_encoder"] = normalise_retrievers([data["tau_encoder"]])[0]
            except ValueError as exc:
                self.add_error("tau_encoder", str(exc))
        if data.get("retrievers"):
            try:
                data["retriever_specs"] = normalise_retrievers(data["retrievers"].splitlines())
            except ValueError as exc:
                self.add_error("retrievers", str(exc))
        return data


def installed_kinds() -> list[dict[str, Any]]:
    """Every installed retriever kind (built-ins and plugins) for the form: prefix and what it is."""
    from retrieval.retrievers import kinds

    return [{"prefix": prefix, "description": getattr(kind, "description", "")} for prefix, kind in kinds().items()]


def pool_preview(dataset: Dataset, scope: str, specs: list[str]) -> list[dict[str, Any]]:
    """Per retriever of the pool: kind, fusion, the encoder passes an audit of ``scope`` needs
    with nothing cached (late fusion against early fusion:
    :meth:`retrieval.retrievers.base.RetrieverKind.expected_passes`) and, for an ``api:``
    retriever, the estimated calls and US dollars (its candidates already cached left out).
    Reads the database only: nothing is built, encoded or sent."""
    from retrieval.retrievers import parse_spec
    from retrieval.retrievers.api.budget import pool_estimates, scope_workload

    work = scope_workload(dataset.pk, scope)
    queries = [(q.image_key, q.text) for q in work.queries]
    candidates = [c.image_key for c in work.candidates]
    costs = {
        e.spec: e
        for e in pool_estimates(
            specs,
            dataset.pk,
            scope,
            modality_rule=settings.AUDIT_MODALITY_RULE,
            cache_root=settings.EMBEDDING_CACHE_DIR,
        )
    }
    rows = []
    for spec in specs:
        kind, parsed = parse_spec(spec)
        cost = costs.get(kind.canonical(parsed))
        rows.append(
            {
                "spec": spec,
                "kind": kind.prefix,
                "passes": kind.expected_passes(parsed, queries, candidates),
                "cost": None if cost is None else {"usd": cost.usd, "calls": cost.calls, "line": cost.line()},
            }
        )
    return rows
