"""The hostile-input table of the attack report: every probe answers 4xx, names the field
where there is one, and writes nothing (no judgement, draft, study, job or reservation)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient

from annotation.assignment import queue as engine
from annotation.models import Adjudication, Assignment, Draft, ExportJob, Judgement, RubricVersion, Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Image, ImportJob
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

NESTED_LIST = "[" * 100_000 + "]" * 100_000
NESTED_OBJECT = '{"a":' * 60 + "1" + "}" * 60


def ok_judgement(**over) -> str:
    return json.dumps({"category": "VALIDATED", "time_spent_ms": 5, "note": "", **over})


# (case id, who, method, url template, raw body, content type, status, field named in the answer)
CASES = [
    ("deep-json-list-judgement", "ann", "POST", "/api/assignments/{a}/judgements/", NESTED_LIST, "json", 400, ""),
    ("deep-json-object-draft", "ann", "PUT", "/api/assignments/{a}/draft/", NESTED_OBJECT, "json", 400, ""),
    ("deep-json-study", "boss", "POST", "/api/studies/", NESTED_OBJECT, "json", 400, ""),
    (
        "nul-in-note",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(note="a\x00b"),
        "json",
        400,
        "note",
    ),
    (
        "surrogate-in-note",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        '{"category": "VALIDATED", "time_spent_ms": 5, "note": "\\ud800"}',
        "json",
        400,
        "note",
    ),
    (
        "nul-in-token",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(client_token="t\x00"),
        "json",
        400,
        "client_token",
    ),
    (
        "surrogate-in-token",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        '{"category": "VALIDATED", "time_spent_ms": 5, "client_token": "\\udfff"}',
        "json",
        400,
        "client_token",
    ),
    ("nul-in-draft", "ann", "PUT", "/api/assignments/{a}/draft/", json.dumps({"note": "x\x00"}), "json", 400, "note"),
    ("surrogate-key-in-draft", "ann", "PUT", "/api/assignments/{a}/draft/", '{"\\ud83d": 1}', "json", 400, ""),
    (
        "surrogate-in-nested-draft",
        "ann",
        "PUT",
        "/api/assignments/{a}/draft/",
        '{"scales": {"overall": "\\udc00"}}',
        "json",
        400,
        "scales.overall",
    ),
    (
        "1e999-time-spent",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        '{"category": "VALIDATED", "time_spent_ms": 1e999}',
        "json",
        400,
        "time_spent_ms",
    ),
    (
        "-1e999-in-draft",
        "ann",
        "PUT",
        "/api/assignments/{a}/draft/",
        '{"elapsed_ms": -1e999}',
        "json",
        400,
        "elapsed_ms",
    ),
    (
        "NaN-time-spent",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        '{"category": "VALIDATED", "time_spent_ms": NaN}',
        "json",
        400,
        "",
    ),
    (
        "huge-int-time-spent",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(time_spent_ms=10**30),
        "json",
        400,
        "time_spent_ms",
    ),
    (
        "out-of-range-time-spent",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(time_spent_ms=2**40),
        "json",
        400,
        "time_spent_ms",
    ),
    (
        "1e999-seed",
        "boss",
        "POST",
        "/api/studies/",
        '{"name": "x", "datasets": ["circo"], "seed": 1e999}',
        "json",
        400,
        "seed",
    ),
    (
        "huge-seed",
        "boss",
        "POST",
        "/api/studies/",
        json.dumps({"name": "x", "datasets": ["circo"], "seed": 2**40}),
        "json",
        400,
        "seed",
    ),
    (
        "huger-seed",
        "boss",
        "POST",
        "/api/studies/",
        json.dumps({"name": "x", "datasets": ["circo"], "seed": 10**40}),
        "json",
        400,
        "seed",
    ),
    (
        "nul-in-study-name",
        "boss",
        "POST",
        "/api/studies/",
        json.dumps({"name": "x\x00", "datasets": ["circo"]}),
        "json",
        400,
        "name",
    ),
    ("not-utf8", "ann", "POST", "/api/assignments/{a}/judgements/", b'{"note": "\xff\xfe"}', "json", 400, ""),
    (
        "bad-base-revision",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(base_revision="x"),
        "json",
        400,
        "base_revision",
    ),
    (
        "form-encoded-judgement",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        "category=VALIDATED&time_spent_ms=5",
        "form",
        400,
        "",
    ),
    # issue 29: integers of 5,000 digits (Python refuses to convert over 4,300), in JSON and in a string
    (
        "5000-digit-time-spent",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        '{"category": "VALIDATED", "time_spent_ms": ' + "9" * 5000 + "}",
        "json",
        400,
        "time_spent_ms",
    ),
    (
        "5000-digit-time-spent-string",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        ok_judgement(time_spent_ms="9" * 5000),
        "json",
        400,
        "time_spent_ms",
    ),
    (
        "5000-digit-draft",
        "ann",
        "PUT",
        "/api/assignments/{a}/draft/",
        '{"elapsed_ms": -' + "9" * 5000 + "}",
        "json",
        400,
        "elapsed_ms",
    ),
    (
        "5000-digit-study-seed",
        "boss",
        "POST",
        "/api/studies/",
        '{"name": "x", "datasets": ["circo"], "seed": ' + "9" * 5000 + "}",
        "json",
        400,
        "seed",
    ),
    ("negative-seed-report", "boss", "GET", "/studies/{s}/report/?seed=-1", None, None, 400, "seed"),
    ("negative-seed-json", "boss", "GET", "/studies/{s}/report.json?seed=-1", None, None, 400, "seed"),
    ("negative-seed-csv", "boss", "GET", "/studies/{s}/report.csv?seed=-1", None, None, 400, "seed"),
    ("huge-seed-json", "boss", "GET", "/studies/{s}/report.json?seed=" + "9" * 5000, None, None, 400, "seed"),
    (
        "nul-primary-report",
        "boss",
        "GET",
        "/studies/{s}/report.json?policy=primary&primary=a%00b",
        None,
        None,
        400,
        "primary",
    ),
    (
        "nul-in-adjudication-note",
        "boss",
        "POST",
        "/studies/{s}/adjudication/{item}/",
        "decision=validated&note=a%00b",
        "form",
        400,
        "note",
    ),
    (
        "nul-in-export-primary",
        "boss",
        "POST",
        "/studies/{s}/export/",
        "policy=primary&primary=ann%00",
        "form",
        400,
        "primary",
    ),
    (
        "nul-in-room-username",
        "boss",
        "POST",
        "/room/studies/{s}/annotators/",
        "username=ann%00",
        "form",
        400,
        "username",
    ),
    ("study-abc", "ann", "GET", "/api/assignments/?study=abc", None, None, 400, "study"),
    ("study-nul", "ann", "GET", "/api/assignments/?study=%00", None, None, 400, "study"),
    ("study-superscript", "ann", "GET", "/api/assignments/?study=%C2%B2", None, None, 400, "study"),
    ("image-size-superscript", "ann", "GET", "/images/{image}/?size=%C2%B2", None, None, 400, ""),
    ("image-size-arabic-digit", "ann", "GET", "/images/{image}/?size=%D9%A3", None, None, 400, ""),
]

TYPES = {"json": "application/json", "form": "application/x-www-form-urlencoded"}


@pytest.fixture
def world(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    ann = make_annotator("ann")
    boss = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
    study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=4, annotators=["ann"]))
    asg = engine.next_assignment(study, ann).assignment
    return {
        "ann": ann,
        "boss": boss,
        "a": asg.pk,
        "image": Image.objects.first().pk,
        "s": study.pk,
        "item": asg.item_id,
    }


def snapshot():
    return (
        Judgement.objects.count(),
        Draft.objects.count(),
        Study.objects.count(),
        ImportJob.objects.count(),
        ExportJob.objects.count(),
        Adjudication.objects.count(),
        sorted(Study.annotators.through.objects.values_list("pk")),
        sorted(Assignment.objects.values_list("pk", "status", "lease_expires")),
        sorted(StudyItem.objects.values_list("pk", "taken", "completed")),
    )


@pytest.mark.parametrize("case,who,method,url,body,ctype,want,field", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_naming_the_field_and_nothing_is_written(
    world, case, who, method, url, body, ctype, want, field
):
    client = APIClient()
    client.force_login(world[who])
    before = snapshot()
    url = url.format(a=world["a"], image=world["image"], s=world["s"], item=world["item"])
    if body is None:
        resp = client.generic(method, url)
    else:
        resp = client.generic(method, url, body.encode() if isinstance(body, str) else body, TYPES[ctype])
    assert resp.status_code == want, (case, resp.status_code, resp.content[:300])
    if field:
        answer = resp.json()
        assert field in (str(answer.get("field", "")) + json.dumps(answer)), (case, answer)
    assert snapshot() == before, case


def test_anonymous_and_oversized_bodies_are_refused_before_reading(world, client, settings):
    """The guard runs before CSRF, sessions and login: a body claiming more than the limit is
    never read, whoever sends it (a CSRF failure would need the body; it is never reached)."""
    from django.test import Client

    anon = Client(enforce_csrf_checks=True)
    huge = str(155 * 1024 * 1024)
    resp = anon.generic(
        "POST", "/datasets/import/", b"x" * 10, content_type="multipart/form-data; boundary=zz", CONTENT_LENGTH=huge
    )
    assert resp.status_code == 413 and "limit" in resp.json()["detail"]
    signed_in = Client(enforce_csrf_checks=True)
    signed_in.force_login(world["boss"])
    resp = signed_in.generic(
        "POST",
        "/api/studies/",
        b"{}",
        content_type="application/json",
        CONTENT_LENGTH=str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1),
    )
    assert resp.status_code == 413
    resp = signed_in.generic("POST", "/api/studies/", b"{}", content_type="application/json", CONTENT_LENGTH="12abc")
    assert resp.status_code == 400 and resp.json()["field"] == "Content-Length"
    assert not ImportJob.objects.exists()
    from config.settings import MIDDLEWARE

    guard = MIDDLEWARE.index("config.middleware.RequestGuardMiddleware")
    assert MIDDLEWARE[:guard] == [
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
        "config.security.ContentSecurityPolicyMiddleware",
    ]  # they read no body


def test_only_a_verified_session_or_token_lifts_the_body_cap_and_refusals_carry_the_security_headers(world, settings):
    """A made-up ``sessionid`` cookie or ``Authorization`` header lifts nothing (524 MB were read
    with one); a real session or token does. The 413 and 400 carry the security headers."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client
    from rest_framework.authtoken.models import Token

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # a real upload over the cap, small enough for a test

    def post(client, **extra):
        upload = SimpleUploadedFile("val.json", b"[" + b" " * 3000 + b"]", "application/json")
        return client.post("/datasets/import/", {"name": "capped", "format": "circo", "files": [upload]}, **extra)

    fake = Client()
    fake.cookies[settings.SESSION_COOKIE_NAME] = "made-up-session-key-0123456789abcdef"
    for resp in (post(fake), post(Client(), HTTP_AUTHORIZATION="Token " + "0" * 40)):
        assert resp.status_code == 413, resp.content
        assert resp["X-Content-Type-Options"] == "nosniff" and resp["X-Frame-Options"] == "DENY"
        assert "default-src 'self'" in resp["Content-Security-Policy"] and "Referrer-Policy" in resp
    bad = Client().generic("POST", "/api/studies/", b"{}", content_type="application/json", CONTENT_LENGTH="x")
    assert bad.status_code == 400 and bad["X-Content-Type-Options"] == "nosniff" and "Content-Security-Policy" in bad
    # a session whose user was deactivated lifts nothing either
    stale = Client()
    stale.force_login(world["boss"])
    type(world["boss"]).objects.filter(pk=world["boss"].pk).update(is_active=False)
    assert post(stale).status_code == 413
    type(world["boss"]).objects.filter(pk=world["boss"].pk).update(is_active=True)
    real = Client()
    real.force_login(world["boss"])
    assert post(real).status_code != 413
    token = Token.objects.create(user=world["boss"])
    assert post(Client(), HTTP_AUTHORIZATION=f"Token {token.key}").status_code != 413


def test_study_creation_refuses_users_without_the_annotator_role(world):
    get_user_model().objects.create_user("norole", password="pw")
    client = APIClient()
    client.force_authenticate(world["boss"])
    before = Study.objects.count()
    resp = client.post(
        "/api/studies/", {"name": "roles", "datasets": ["circo"], "annotators": ["ann", "norole"]}, format="json"
    )
    assert resp.status_code == 400
    assert "norole" in resp.json()["detail"] and "annotator role" in resp.json()["detail"]
    assert Study.objects.count() == before
    ok = client.post(
        "/api/studies/", {"name": "roles", "datasets": ["circo"], "total": 2, "annotators": ["ann"]}, format="json"
    )
    assert ok.status_code == 201


def test_the_project_room_adds_only_annotators(world, client):
    get_user_model().objects.create_user("norole2", password="pw")
    study = Study.objects.create(name="room-roles", rubric=RubricVersion.builtin("validity"))
    client.force_login(world["boss"])
    resp = client.post(f"/room/studies/{study.pk}/annotators/", {"username": ["ann", "norole2"]}, follow=True)
    assert "norole2" in resp.content.decode() and "annotator role" in resp.content.decode()
    assert not study.annotators.exists()  # nothing added, not even the valid one
    client.post(f"/room/studies/{study.pk}/annotators/", {"username": ["ann"]})
    assert list(study.annotators.values_list("username", flat=True)) == ["ann"]


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("annotators", "norole", "norole is not one of the available choices"),
        ("seed", "99999999999999", "less than or equal to"),
        ("quotas", "[" * 5000 + "]" * 5000, "nested deeper"),
        ("quotas", '{"a": 1e999}', "out of range"),
    ],
)  # a NUL in any field is the middleware's 400 (tests/integration/test_form_text_guard.py)
def test_study_form_refuses_hostile_fields(world, client, field, value, message):
    get_user_model().objects.create_user("norole", password="pw")
    client.force_login(world["boss"])
    data = {
        "name": "f",
        "datasets": ["circo"],
        "rubric": "validity",
        "overlap": 1,
        "seed": 0,
        "agreement_size": 0,
        "lease_minutes": 10,
        "annotators": "ann",
    }
    data[field] = value
    resp = client.post("/studies/new/", data)
    assert resp.status_code == 200 and message in resp.content.decode().replace("&#x27;", "'"), field
    assert not Study.objects.filter(name="f").exists()


def test_security_md_is_true_about_the_cookies(world, client):
    """SECURITY.md says both cookies are HttpOnly and no script reads a cookie."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    resp = client.get("/login/")
    csrf = resp.cookies.get("csrftoken")
    assert csrf is not None and csrf["httponly"] is True
    login = client.post("/login/", {"username": "ann", "password": "pw"})
    assert login.cookies["sessionid"]["httponly"] is True
    assert "CSRF cookie are `HttpOnly`" in (root / "SECURITY.md").read_text().replace("\n  ", " ")
    for script in (root / "static").rglob("*.js"):
        assert "document.cookie" not in script.read_text(), script


@pytest.mark.parametrize(
    "caption,words",
    [
        ("a\\u0000b", "NUL character"),
        ("x\\ud800y", "lone surrogate"),
        ("deep", "nested deeper than 32 levels"),
        ("huge", "64-bit range"),
    ],
)
def test_hostile_dataset_uploads_fail_their_job_in_words_and_are_deleted(
    db, client, settings, tmp_path, caption, words
):
    """Issue 29: a NUL in a caption was a raw DataError and a lone surrogate was stored as
    "x?y"; deep nesting took a web worker to 22 GB. Every upload is parsed by the worker's
    task (eager here), refused by the bounded check, writes nothing, and its file is deleted."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from retrieval.models import Dataset, Query

    settings.UPLOAD_DIR = tmp_path / "uploads"
    records = json.loads((FIXTURES / "datasets/circo/val.json").read_text())[:3]
    text = json.dumps(records)
    if caption == "deep":
        text = text[:-1] + ", " + "[" * 100_000 + "]" * 100_000 + "]"
    elif caption == "huge":
        text = text.replace('"id": 2', '"id": ' + "9" * 5000)
    else:
        text = text.replace(records[1]["relative_caption"], caption)
    boss = get_user_model().objects.create_user("boss2", password="pw", is_staff=True)
    client.force_login(boss)
    upload = SimpleUploadedFile("val.json", text.encode(), "application/json")
    resp = client.post("/datasets/import/", {"name": "hostile", "format": "circo", "files": [upload]})
    assert resp.status_code == 302
    job = ImportJob.objects.get()
    assert job.status == "queued"  # nothing parsed in the request, however small the file
    from retrieval.tasks import run_import

    run_import(job.pk)  # what the worker runs
    job.refresh_from_db()
    assert job.status == "failed" and words in job.error, job.error
    assert str(settings.UPLOAD_DIR) not in job.error and "Traceback" not in job.error
    assert not Dataset.objects.filter(name="hostile").exists() and not Query.objects.exists()
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]
    page = client.get(f"/datasets/imports/{job.pk}/").content.decode()
    assert words in page and str(tmp_path) not in page
