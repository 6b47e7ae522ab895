"""Staff imports from the browser that the CLI also offers: audit rank files
(``import_ranks``) and a CIRCUS study (``import_circus``). The files are stored under
UPLOAD_DIR and the service each command calls runs on them, in the request
(:func:`audit.imports.import_rank_files`, :func:`annotation.studies.circus.import_circus_study`);
the page shows the lines the command prints. The uploads are deleted once it ends, whatever
the outcome. Every JSON file is checked with flat memory before it is parsed
(:func:`retrieval.importers.jsonstream.check_bounds`) and rank files are streamed."""
from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django import forms
from django.conf import settings
from django.utils.text import get_valid_filename

from audit.imports import ImportRanksError, import_rank_files, import_summary
from audit.rankfiles import RankFileError
from retrieval.forms import MultipleFileField
from retrieval.models import Dataset
from retrieval.services import discard_uploads

from annotation.studies.circus import CircusImportError, import_circus_study, summary_line


class RanksForm(forms.Form):
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.all(), to_field_name="name")
    files = MultipleFileField(help_text="retrieval_data_<ds>_task7_<retriever>.json files, or one aggregated audit file.")
    split = forms.CharField(required=False, help_text="Needed when several splits share ordinals.")
    k = forms.IntegerField(required=False, min_value=1, help_text="Default: metadata.k of the files (else 10).")
    min_mm_retrievers = forms.IntegerField(min_value=1, initial=1)
    force = forms.BooleanField(required=False, label="Force (--force)",
                               help_text="Import even if the files' query texts differ from the dataset's.")


class CircusForm(forms.Form):
    study_name = forms.CharField(max_length=200)
    files = MultipleFileField(help_text="annotations/users/*.json or agreement_users/*.json")
    dataset_prefix = forms.CharField(required=False, initial="circus", help_text="Datasets are named <prefix>-<dataset>.")
    verify_checksum = forms.BooleanField(required=False, initial=True)


@dataclass
class ImportResult:
    command: str
    files: list[str]
    status: str = "done"
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str = ""


def store(files) -> tuple[list[str], list[str]]:
    """Write the uploads to a fresh folder: (server paths, the names as uploaded)."""
    folder = Path(settings.UPLOAD_DIR) / uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    paths, names = [], []
    for f in files:
        target = folder / get_valid_filename(Path(f.name).name)
        with open(target, "wb") as out:
            for chunk in f.chunks():
                out.write(chunk)
        paths.append(str(target))
        names.append(Path(f.name).name)
    return paths, names


def run_service(name: str, names: list[str], service: Callable[[], tuple[list[str], list[str]]],
                errors: tuple[type[Exception], ...]) -> ImportResult:
    """Run an import service; its (lines, warnings), or its refusal, without server paths."""
    result = ImportResult(name, names)
    try:
        result.lines, result.warnings = service()
    except errors as exc:
        result.status, result.error = "failed", str(exc)
    uploads = str(Path(settings.UPLOAD_DIR))
    clean = lambda s: s.replace(uploads + "/", "")  # noqa: E731 - never show server paths
    result.lines = [clean(x) for x in result.lines if x.strip()]
    result.warnings = [clean(x) for x in result.warnings if x.strip()]
    result.error = clean(result.error)
    return result


def import_ranks(form: RanksForm) -> ImportResult:
    d = form.cleaned_data
    paths, names = store(d["files"])

    def service():
        return import_summary(*import_rank_files(d["dataset"].name, paths, split=d["split"] or None, k=d["k"],
                                                 min_mm_retrievers=d["min_mm_retrievers"], force=d["force"]))

    try:
        return run_service("import_ranks", names, service, (ImportRanksError, RankFileError))
    finally:
        discard_uploads(paths)  # whatever the outcome, as SECURITY.md says


def import_circus(form: CircusForm) -> ImportResult:
    d = form.cleaned_data
    paths, names = store(d["files"])

    def service():
        summary = import_circus_study(paths, d["study_name"], d["dataset_prefix"] or "",
                                      verify_checksum=d["verify_checksum"])
        return [summary_line(summary)], []

    try:
        return run_service("import_circus", names, service, (CircusImportError,))
    finally:
        discard_uploads(paths)  # whatever the outcome, as SECURITY.md says
