"""The 'New audit' form (staff)."""
from __future__ import annotations

from django import forms

from retrieval.models import Dataset

from .services import AuditError, normalise_retrievers, resolve_split

DEFAULT_POOL = "openclip:cirval-tiny-vit\nopenclip:cirval-tiny-vit-b"


class AuditForm(forms.Form):
    dataset = forms.ModelChoiceField(Dataset.objects.all(), to_field_name="name", empty_label=None)
    split = forms.CharField(required=False, max_length=50, help_text="Empty: the dataset's only split.")
    retrievers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}), initial=DEFAULT_POOL,
        help_text="One retriever spec a line, e.g. openclip:ViT-B-32@openai or openclip:cirval-tiny-vit.",
    )
    k = forms.IntegerField(label="K", min_value=1, max_value=1000, initial=10)
    min_mm_retrievers = forms.IntegerField(
        label="Minimum retrievers within K (multimodal)", min_value=0, initial=1,
        help_text="How many retrievers must solve a query multimodally for composition_required.",
    )
    exclude_reference = forms.BooleanField(
        required=False, initial=True, label="Leave each query's reference image out of its gallery"
    )

    def clean(self):
        data = super().clean()
        dataset = data.get("dataset")
        if dataset is not None:
            try:
                data["split"] = resolve_split(dataset, data.get("split") or None)
            except AuditError as exc:
                self.add_error("split", str(exc))
        if data.get("retrievers"):
            try:
                data["retriever_specs"] = normalise_retrievers(data["retrievers"].splitlines())
            except ValueError as exc:
                self.add_error("retrievers", str(exc))
        return data
