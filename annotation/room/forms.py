from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password

from annotation.core.study_settings import GoldSettings, QuorumSettings
from annotation.models import Study

ROLE_CHOICES = [("annotator", "Annotator"), ("researcher", "Researcher"), ("admin", "Admin (staff)")]


class UserForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, widget=forms.CheckboxSelectMultiple, required=False)
    password = forms.CharField(
        required=False,
        widget=forms.PasswordInput,
        help_text="Leave empty to invite: you get a link where they choose their own.",
    )

    def clean_username(self):
        name = self.cleaned_data["username"].strip()
        if get_user_model().objects.filter(username=name).exists():
            raise forms.ValidationError("That user name is taken.")
        return name

    def clean(self):
        data = super().clean()
        if data.get("password"):
            validate_password(data["password"], get_user_model()(username=data.get("username", "")))
        return data


class RolesForm(forms.Form):
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, widget=forms.CheckboxSelectMultiple, required=False)


class StudySettingsForm(forms.ModelForm):
    """A study's quorum and gold settings, its serve order and lease, its guidelines. Their rules
    are the setting groups' (annotation.core.study_settings), checked by ``Study.clean()``, which
    the model form runs: each problem shows on its field."""

    class Meta:
        model = Study
        fields = [
            *QuorumSettings.field_names(),
            "serve_order",
            "lease_minutes",
            *GoldSettings.field_names(),
            "guidelines",
        ]
        labels = {
            "overlap": "Overlap (annotators per item)",
            "quorum": "Quorum (current judgements before an item is decided; empty: the overlap)",
            "gold_rate": "Gold rate (0–1)",
            "serve_order": "Serve fresh items by",
            "adaptive_max": "Adaptive overlap: at most this many annotators, one more while they disagree "
            "(empty: a fixed overlap)",
            "consensus": "Consensus (majority, or weighted by the annotators' Dawid-Skene reliability)",
            "adaptive_confidence": "Adaptive overlap, reliability-weighted: decide a split without a further "
            "annotator once the reliability posterior is this sure (0.5–1)",
            "training_items": "Training items (gold, with feedback, before real items)",
            "too_fast_seconds": "Too fast below (seconds)",
            "straight_run": "Straight-lining run length",
            "guidelines": "Guidelines (Markdown; example images as ![caption](/images/ID/))",
        }
        widgets = {"guidelines": forms.Textarea(attrs={"rows": 10})}


class GoldForm(forms.Form):
    """An item marked gold by hand; ``category``: the expected invalid category, optional
    (training feedback then names it, and a judgement must name it to be right)."""

    item = forms.IntegerField(min_value=1, label="Item id")
    answer = forms.ChoiceField(choices=[("valid", "validated"), ("invalid", "not valid"), ("none", "not gold")])
    category = forms.ChoiceField(required=False, label="Expected category (not valid only)")

    def __init__(self, *args, rubric=None, **kwargs):
        super().__init__(*args, **kwargs)
        invalid = [(c.key, c.label) for c in (rubric.categories if rubric is not None else ()) if not c.valid]
        self.fields["category"].choices = [("", "any invalid category"), *invalid]

    def clean(self):
        data = super().clean()
        if data.get("category") and data.get("answer") != "invalid":
            self.add_error("category", "A category goes with “not valid” only.")
        return data
