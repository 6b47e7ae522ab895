from __future__ import annotations

from pathlib import Path

from django import forms
from django.conf import settings

from . import importers
from .imagefiles import within_any
from .loader import LoadError, check_dataset_name
from .models import Dataset


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput())
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, (list, tuple)):
            return [single(d, initial) for d in data]
        return [single(data, initial)]


class ImportForm(forms.Form):
    format = forms.ChoiceField(choices=[(f, f) for f in sorted(importers.FORMATS)])
    name = forms.SlugField(max_length=100, help_text="Dataset name; an existing name is updated in place.")
    split = forms.CharField(max_length=50, required=False, help_text="Leave empty to read it from the file names.")
    images_root = forms.CharField(
        max_length=1000, required=False, help_text="Folder the image paths are relative to; must be under IMAGE_ROOTS."
    )
    files = MultipleFileField(help_text="Keep the original file names: the format is recognised from them.")
    delete_removed = forms.BooleanField(
        required=False,
        label="Delete records missing from the file",
        help_text="On a re-import, delete the stored records these files no longer hold (with their audit results "
        "and subset memberships). Unticked, such an import is refused and names them.",
    )

    def clean_name(self):
        name = self.cleaned_data["name"]
        if not Dataset.objects.filter(name=name).exists():
            try:
                check_dataset_name(name)
            except LoadError as exc:
                raise forms.ValidationError(str(exc)) from None
        return name

    def clean_images_root(self):
        raw = self.cleaned_data["images_root"].strip()
        if not raw:
            return ""
        root = Path(raw).resolve()
        if not root.is_dir():
            raise forms.ValidationError(f"{root} is not a folder on the server.")
        if not within_any(root, settings.IMAGE_ROOTS):
            roots = ", ".join(str(r) for r in settings.IMAGE_ROOTS)
            raise forms.ValidationError(f"{root} is not under IMAGE_ROOTS ({roots}).")
        return str(root)

    def clean_files(self):
        files = self.cleaned_data["files"]
        total = sum(f.size for f in files)
        if total > settings.CIRVAL_MAX_UPLOAD_BYTES:
            raise forms.ValidationError(
                f"The files add up to {total} bytes; the limit is {settings.CIRVAL_MAX_UPLOAD_BYTES}."
            )
        return files
