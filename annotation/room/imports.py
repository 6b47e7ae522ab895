"""Staff imports from the browser that the CLI also offers: audit rank files
(``import_ranks``) and a CIRCUS study (``import_circus``). The request only stores the files
under UPLOAD_DIR and queues a :class:`annotation.models.RoomImportJob`; a worker runs the service
each command calls on them (:func:`audit.imports.import_rank_files`,
:func:`annotation.studies.circus.import_circus_study`) and the job's page shows the lines the
command prints, or its refusal. The uploads are deleted once it ends, whatever the outcome.
Every JSON file is checked with flat memory before it is parsed
(:func:`retrieval.importers.jsonstream.check_bounds`) and rank files are streamed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from django import forms
from django.conf import settings
from django.utils.text import get_valid_filename

from annotation.models import RoomImportJob
from annotation.studies.circus import CircusImportError, import_circus_study, summary_line
from audit.imports import ImportRanksError, import_rank_files, import_summary
from audit.rankfiles import RankFileError
from retrieval.forms import MultipleFileField
from retrieval.jobs.leases import run_job
from retrieval.jobs.sending import enqueue
from retrieval.models import Dataset
from retrieval.services import discard_uploads

#: The Celery task that runs a queued room import (:mod:`annotation.tasks`).
RUN_ROOM_IMPORT = "annotation.run_room_import"


class RanksForm(forms.Form):
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.all(), to_field_name="name")
    files = MultipleFileField(
        help_text="retrieval_data_<ds>_task7_<retriever>.json files, or one aggregated audit file."
    )
    split = forms.CharField(
        required=False,
        help_text="The scope the files rank: a split (val) or a category of one (dress/val); needed when several source files (splits, FashionIQ categories) share ordinals.",
    )
    k = forms.IntegerField(required=False, min_value=1, help_text="Default: metadata.k of the files (else 10).")
    min_mm_retrievers = forms.IntegerField(min_value=1, initial=1)
    force = forms.BooleanField(
        required=False,
        label="Force (--force)",
        help_text="Import even if the files' query texts differ from the dataset's.",
    )


class CircusForm(forms.Form):
    study_name = forms.CharField(max_length=200)
    files = MultipleFileField(help_text="annotations/users/*.json or agreement_users/*.json")
    dataset_prefix = forms.CharField(
        required=False, initial="circus", help_text="Datasets are named <prefix>-<dataset>."
    )
    verify_checksum = forms.BooleanField(required=False, initial=True)


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


def queue_import(command: str, form: forms.Form, user) -> tuple[RoomImportJob, bool]:
    """Store the uploads and queue a :class:`RoomImportJob` (nothing is parsed here): the job
    and whether its message reached the broker."""
    d = dict(form.cleaned_data)
    paths, names = store(d.pop("files"))
    if isinstance(d.get("dataset"), Dataset):
        d["dataset"] = d["dataset"].name
    job = RoomImportJob.objects.create(
        command=command,
        options=d,
        paths=paths,
        names=names,
        total=1,
        stage="queued",
        created_by=user if user.is_authenticated else None,
    )
    return job, enqueue(RoomImportJob, job.pk, RUN_ROOM_IMPORT)


def _ranks(paths: list[str], o: dict) -> tuple[list[str], list[str]]:
    return import_summary(
        *import_rank_files(
            o["dataset"],
            paths,
            split=o.get("split") or None,
            k=o.get("k"),
            min_mm_retrievers=o.get("min_mm_retrievers") or 1,
            force=bool(o.get("force")),
        )
    )


def _circus(paths: list[str], o: dict) -> tuple[list[str], list[str]]:
    summary = import_circus_study(
        paths, o["study_name"], o.get("dataset_prefix") or "", verify_checksum=bool(o.get("verify_checksum"))
    )
    return [summary_line(summary)], []


#: Each command's service and the errors that are its refusals (said in the CLI's words).
SERVICES: dict[str, tuple[Callable[[list[str], dict], tuple[list[str], list[str]]], tuple[type[Exception], ...]]] = {
    RoomImportJob.RANKS: (_ranks, (ImportRanksError, RankFileError)),
    RoomImportJob.CIRCUS: (_circus, (CircusImportError,)),
}


def _clean(text: str) -> str:
    """Never show server paths: an upload is named by its folder and file name."""
    return text.replace(str(Path(settings.UPLOAD_DIR)) + "/", "")


def run_room_import_job(job: RoomImportJob) -> RoomImportJob:
    """Run one queued room import under :func:`retrieval.jobs.leases.run_job` (on a worker,
    never in the request): done with the lines and warnings the command prints, or failed
    with its refusal in the same words. The uploads are deleted whatever the outcome."""
    service, refusals = SERVICES[job.command]

    def work(report) -> dict:
        report("importing", 0, 1)
        try:
            lines, warnings = service(list(job.paths), dict(job.options))
        except refusals as exc:
            raise ValueError(_clean(str(exc))) from None
        finally:
            discard_uploads(list(job.paths))  # whatever the outcome, as SECURITY.md says
        report("importing", 1, 1)
        return {
            "lines": [_clean(x) for x in lines if x.strip()],
            "warnings": [_clean(x) for x in warnings if x.strip()],
        }

    run_job(RoomImportJob, job.pk, work)
    job.refresh_from_db()
    return job
