from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password

from annotation.models import Study

ROLE_CHOICES = [("annotator", "Annotator"), ("researcher", "Researcher"), ("admin", "Admin (staff)")]


class UserForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    roles = forms.MultipleChoiceField(choices=ROLE_CHOICES, widget=forms.CheckboxSelectMultiple, required=False)
    password = forms.CharField(required=False, widget=forms.PasswordInput,
                               help_text="Leave empty to invite: you get a link where they choose their own.")

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
    class Meta:
        model = Study
        fields = ["overlap", "quorum", "serve_order", "adaptive_max", "consensus", "adaptive_confidence", "lease_minutes", "gold_rate", "training_items", "too_fast_seconds", "straight_run",
                  "guidelines"]
        labels = {"overlap": "Overlap (annotators per item)",
                  "quorum": "Quorum (current judgements before an item is decided; empty: the overlap)", "gold_rate": "Gold rate (0–1)", "serve_order": "Serve fresh items by",
                  "adaptive_max": "Adaptive overlap: at most this many annotators, one more while they disagree "
                                  "(empty: a fixed overlap)",
                  "consensus": "Consensus (majority, or weighted by the annotators' Dawid-Skene reliability)",
                  "adaptive_confidence": "Adaptive overlap, reliability-weighted: decide a split without a further "
                                         "annotator once the reliability posterior is this sure (0.5–1)",
                  "training_items": "Training items (gold, with feedback, before real items)",
                  "too_fast_seconds": "Too fast below (seconds)", "straight_run": "Straight-lining run length",
                  "guidelines": "Guidelines (Markdown; example images as ![caption](/images/ID/))"}
        widgets = {"guidelines": forms.Textarea(attrs={"rows": 10})}

    def clean_gold_rate(self):
        rate = self.cleaned_data["gold_rate"]
        if not 0 <= rate <= 1:
            raise forms.ValidationError("A rate between 0 and 1.")
        return rate

    def clean_overlap(self):
        n = self.cleaned_data["overlap"]
        if not 1 <= n <= 50:
            raise forms.ValidationError("Between 1 and 50.")
        return n

    def clean(self):
        data = super().clean()
        most, overlap = data.get("adaptive_max"), data.get("overlap")
        if most is not None and overlap is not None and most <= overlap:
            self.add_error("adaptive_max", f"More than the overlap ({overlap}), or empty.")
        return data

    def clean_straight_run(self):
        n = self.cleaned_data["straight_run"]
        if n < 2:
            raise forms.ValidationError("At least 2.")
        return n


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
