"""Rank files and a CIRCUS study imported from the project room's page: the request stores the
uploads and queues a RoomImportJob; a worker runs it (here eagerly, in-process, and once on a
real worker) and the job's page shows the command's lines or its refusal."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from annotation.models import RubricVersion, Study
from audit.models import AuditRun
from tests.conftest import FIXTURES
from tests.integration.test_audit_import import ALPHA, BETA, other, tiny  # noqa: F401 - the fixtures

pytestmark = pytest.mark.django_db


class FollowingClient(Client):
    """Posts follow the redirect to the job's page (the eager worker has run the job)."""

    def post(self, *args, **kwargs):
        kwargs.setdefault("follow", True)
        return super().post(*args, **kwargs)


@pytest.fixture
def staff_client(settings, tmp_path, eager_celery):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    c = FollowingClient()
    c.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    return c


def test_rank_files_from_the_browser(staff_client, tiny, settings):  # noqa: F811
    with open(ALPHA, "rb") as a, open(BETA, "rb") as b:
        resp = staff_client.post(
            "/room/imports/",
            {"which": "ranks", "ranks-dataset": "tiny", "ranks-files": [a, b], "ranks-min_mm_retrievers": 1},
        )
    page = resp.content.decode()
    run = AuditRun.objects.get()
    assert run.source == "imported" and run.retrievers == ["alpha", "beta"]
    assert 'class="status done"' in page and f"Audit {run.pk}:" in page
    assert f"<code>{ALPHA.name}</code>" in page and str(settings.UPLOAD_DIR) not in page
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]  # deleted once the import ended


CIRCUS_FILES = sorted((FIXTURES / "circus" / "agreement_users").glob("annotator_*.json"))


def post_circus(client: Client, study_name: str):
    """Post the CIRCUS fixture's annotator files to the room's form."""
    handles = [open(p, "rb") for p in CIRCUS_FILES]
    try:
        return client.post(
            "/room/imports/",
            {
                "which": "circus",
                "circus-study_name": study_name,
                "circus-files": handles,
                "circus-dataset_prefix": "circus",
                "circus-verify_checksum": "on",
            },
        )
    finally:
        for h in handles:
            h.close()


def test_circus_study_from_the_browser(staff_client):
    files = CIRCUS_FILES
    resp = post_circus(staff_client, "circus-web")
    page = resp.content.decode()
    study = Study.objects.get(name="circus-web")
    assert 'class="status done"' in page and f"Study {study.pk}" in page
    assert study.items.count() > 0 and study.annotators.count() == len(files)


def _listed(page: str, section: str) -> list[str]:
    """The <li> lines of the result card's list ``section`` (plain lines or warnings)."""
    import re

    card = page[page.index('id="import-result"') : page.index("</section>", page.index('id="import-result"'))]
    block = card if section == "lines" else card[card.index('class="warnings"') :]
    if section == "lines":
        block = block[block.index('<ul class="plain">') : block.index("</ul>", block.index('<ul class="plain">'))]
    return [html.unescape(x) for x in re.findall(r"<li[^>]*>(.*?)</li>", block)]


def test_the_room_and_the_command_run_one_service_and_say_the_same(staff_client, tiny, settings):  # noqa: F811
    """The page calls audit.imports.import_rank_files / import_summary, as manage.py import_ranks
    does (no call_command in a request): same run, same lines, same warnings."""
    from io import StringIO

    from django.core.management import call_command

    with open(ALPHA, "rb") as a:
        page = staff_client.post(
            "/room/imports/",
            {"which": "ranks", "ranks-dataset": "tiny", "ranks-files": [a], "ranks-min_mm_retrievers": 1},
        ).content.decode()
    out, err = StringIO(), StringIO()
    call_command("import_ranks", str(ALPHA), "--dataset", "tiny", stdout=out, stderr=err)
    web_run, cli_run = AuditRun.objects.order_by("pk")
    assert web_run.summary["counts"] == cli_run.summary["counts"]
    cli_lines = [x for x in out.getvalue().splitlines() if x.strip()]
    assert cli_lines[0].startswith(f"Audit {cli_run.pk}:")
    same_run = [x.replace(f"Audit {cli_run.pk}:", f"Audit {web_run.pk}:") for x in cli_lines]
    assert [x.strip() for x in _listed(page, "lines")] == [x.strip() for x in same_run]
    cli_warnings = [x for x in err.getvalue().splitlines() if x.strip()]
    assert (_listed(page, "warnings") if cli_warnings else []) == cli_warnings


def test_the_room_shows_the_services_refusal_in_the_commands_words(staff_client):
    from django.core.management import CommandError, call_command

    Study.objects.create(name="taken", rubric=RubricVersion.builtin("validity"))
    path = sorted((FIXTURES / "circus" / "agreement_users").glob("annotator_*.json"))[0]
    with pytest.raises(CommandError) as cli:
        call_command("import_circus", str(path), "--study-name", "taken")
    with open(path, "rb") as h:
        page = staff_client.post(
            "/room/imports/",
            {
                "which": "circus",
                "circus-study_name": "taken",
                "circus-files": [h],
                "circus-dataset_prefix": "circus",
                "circus-verify_checksum": "on",
            },
        ).content.decode()
    assert 'class="status failed"' in page and str(cli.value) in html.unescape(page)


def test_rank_files_of_another_dataset_are_refused_on_the_page_unless_forced(staff_client, other):  # noqa: F811
    def post(force: bool):
        with open(ALPHA, "rb") as a:
            data = {"which": "ranks", "ranks-dataset": "other", "ranks-files": [a], "ranks-min_mm_retrievers": 1}
            if force:
                data["ranks-force"] = "on"
            return staff_client.post("/room/imports/", data).content.decode()

    page = post(force=False)
    assert 'class="status failed"' in page and "do not match dataset &#x27;other&#x27;" in page
    assert "Nothing was imported" in page and "--force" in page
    assert "Force (--force)" in staff_client.get("/room/imports/").content.decode()  # the form offers it
    assert not AuditRun.objects.exists()
    page = post(force=True)
    run = AuditRun.objects.get()
    assert 'class="status done"' in page and run.summary["import"]["forced"] is True
    assert "imported with --force although 4 query text(s) differ" in page


HOSTILE = {
    "deep": ('{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 32 levels"),
    "huge-int": ('{"metadata": {"k": ' + "9" * 5000 + '}, "samples": []}', "64-bit range"),
    "nul": ('{"metadata": {"dataset": "a\\u0000"}, "samples": []}', "NUL character"),
}


@pytest.mark.parametrize("which", ["ranks", "circus"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_room_imports_fail_in_words_write_nothing_and_delete_their_upload(
    staff_client,
    tiny,
    settings,  # noqa: F811
    which,
    case,
    tmp_path,
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    text, words = HOSTILE[case]
    upload = SimpleUploadedFile("retrieval_data_tiny_task7_x.json", text.encode(), "application/json")
    data = (
        {"which": "ranks", "ranks-dataset": "tiny", "ranks-files": [upload], "ranks-min_mm_retrievers": 1}
        if which == "ranks"
        else {
            "which": "circus",
            "circus-study_name": "evil",
            "circus-files": [upload],
            "circus-dataset_prefix": "circus",
        }
    )
    resp = staff_client.post("/room/imports/", data)
    page = resp.content.decode()
    assert resp.status_code == 200 and 'class="status failed"' in page and words in page, page[-2000:]
    assert str(settings.UPLOAD_DIR) not in page
    assert not AuditRun.objects.exists() and not Study.objects.filter(name="evil").exists()
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]  # the upload is gone


def test_the_request_only_stores_the_upload_and_queues_the_job(settings, tmp_path, tiny, monkeypatch):  # noqa: F811
    """No worker runs here (not eager): the request never calls the service, the upload waits
    on disk for the worker, and the job page says it is queued; the job then runs and deletes it."""
    from annotation.models import RoomImportJob
    from annotation.room import imports

    settings.UPLOAD_DIR = tmp_path / "uploads"
    calls = []
    real = imports.SERVICES[RoomImportJob.RANKS]
    monkeypatch.setitem(imports.SERVICES, RoomImportJob.RANKS, (lambda *a: calls.append(a) or real[0](*a), real[1]))
    c = Client()
    c.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    with open(ALPHA, "rb") as a:
        resp = c.post(
            "/room/imports/",
            {"which": "ranks", "ranks-dataset": "tiny", "ranks-files": [a], "ranks-min_mm_retrievers": 1},
        )
    job = RoomImportJob.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/room/imports/{job.pk}/"
    assert calls == [] and job.status == "queued" and not AuditRun.objects.exists()
    assert [p.name for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()] == [ALPHA.name]
    page = c.get(resp["Location"]).content.decode()
    assert 'class="status queued"' in page and f"<code>{ALPHA.name}</code>" in page
    assert imports.run_room_import_job(job).status == "done" and len(calls) == 1
    assert AuditRun.objects.get().retrievers == ["alpha"]
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]
    status = c.get(f"/room/imports/{job.pk}/status/").json()
    assert status["status"] == "done" and status["percent"] == 100 and status["report"]["lines"] == job.lines


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_circus_import_runs_on_a_real_worker(worker_factory):
    """The room's CIRCUS import goes through the broker to a real ``celery worker`` process,
    which imports the study and deletes the uploads."""
    from pathlib import Path

    from annotation.models import RoomImportJob
    from tests.conftest import wait_for

    c = Client()
    c.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    files = CIRCUS_FILES
    resp = post_circus(c, "circus-worker")
    job = RoomImportJob.objects.get()
    assert resp.status_code == 302 and job.status == "queued" and all(Path(p).is_file() for p in job.paths)
    worker = worker_factory(queues="celery").start("room-import")

    def finished():
        job.refresh_from_db()
        return job.status in ("done", "failed")

    wait_for(finished, timeout=120, what=f"the worker to run the room import\n{worker.log()}")
    assert job.status == "done", job.error
    study = Study.objects.get(name="circus-worker")
    assert job.lines and f"Study {study.pk}" in job.lines[0] and study.annotators.count() == len(files)
    assert not any(Path(p).exists() for p in job.paths) and "annotation.run_room_import" in worker.log()
