"""NUL and other control characters in a request's text are a 400 in every body type (issue 41,
item 3): one check (config.parsing.check_text), run by RequestGuardMiddleware on URL-encoded and
multipart bodies whatever the method, and by the API's JSON parser on JSON.

A multipart NUL used to reach the views: four of them stored it and PostgreSQL answered a 500
(the adjudication note, the room's annotator add and remove, the export's primary). Here every
form and endpoint that takes text gets a multipart body with a NUL, then with an escape
character, in one text field: 400, the field named, nothing written (no row changed, no file
stored). Files themselves are bytes and may hold NUL; only their names are text.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.urls import resolve
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from annotation.assignment import queue as engine
from annotation.models import Adjudication
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Image, ImportJob
from tests.conftest import FIXTURES, ROOT, make_annotator

pytestmark = pytest.mark.django_db

HOSTILE = {"NUL": "\x00", "ESC": "\x1b"}
CIRCO_VAL = (FIXTURES / "datasets/circo/val.json").read_bytes()


def upload(name: str = "val.json", content: bytes = CIRCO_VAL) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/json")


# (case id, who, method, url template, form fields, the text field that gets the character)
CASES = [
    ("login", None, "POST", "/login/", {"username": "ann", "password": "pw"}, "username"),
    ("login-password", None, "POST", "/login/", {"username": "ann", "password": "pw"}, "password"),
    (
        "room-user-new",
        "boss",
        "POST",
        "/room/users/",
        {"username": "newbie", "email": "", "password": "", "roles": "annotator"},
        "username",
    ),
    ("room-user-roles", "boss", "POST", "/room/users/{ann_id}/", {"roles": "annotator"}, "roles"),
    (
        "room-invite-password",
        None,
        "POST",
        "/room/invite/{uid}/{token}/",
        {"new_password1": "a-long-pass-1234", "new_password2": "a-long-pass-1234"},
        "new_password1",
    ),
    (
        "room-study-settings",
        "boss",
        "POST",
        "/room/studies/{s}/settings/",
        {
            "overlap": 1,
            "serve_order": "random",
            "consensus": "majority",
            "lease_minutes": 10,
            "gold_rate": 0,
            "training_items": 0,
            "too_fast_seconds": 1,
            "straight_run": 5,
            "guidelines": "Look.",
        },
        "guidelines",
    ),
    ("room-annotator-add", "boss", "POST", "/room/studies/{s}/annotators/", {"username": "bob"}, "username"),
    (
        "room-annotator-remove",
        "boss",
        "POST",
        "/room/studies/{s}/annotators/",
        {"username": "ann", "action": "remove"},
        "username",
    ),
    ("room-study-status", "boss", "POST", "/room/studies/{s}/status/", {"action": "pause"}, "action"),
    (
        "room-gold",
        "boss",
        "POST",
        "/room/studies/{s}/gold/",
        {"item": "{item}", "answer": "invalid", "category": "", "action": "mark"},
        "category",
    ),
    (
        "room-import-ranks",
        "boss",
        "POST",
        "/room/imports/",
        {"which": "ranks", "dataset": "circo", "split": "val", "min_mm_retrievers": 1, "files": "FILE"},
        "split",
    ),
    (
        "room-import-circus",
        "boss",
        "POST",
        "/room/imports/",
        {"which": "circus", "study_name": "c", "dataset_prefix": "circus", "files": "FILE"},
        "study_name",
    ),
    (
        "study-new",
        "boss",
        "POST",
        "/studies/new/",
        {
            "name": "f",
            "datasets": "circo",
            "rubric": "validity",
            "overlap": 1,
            "seed": 0,
            "agreement_size": 0,
            "lease_minutes": 10,
            "guidelines": "Look.",
        },
        "guidelines",
    ),
    (
        "study-new-quotas",
        "boss",
        "POST",
        "/studies/new/",
        {
            "name": "f",
            "datasets": "circo",
            "rubric": "validity",
            "overlap": 1,
            "seed": 0,
            "agreement_size": 0,
            "lease_minutes": 10,
            "quotas": '{"circo": 1}',
        },
        "quotas",
    ),
    (
        "adjudication-note",
        "boss",
        "POST",
        "/studies/{s}/adjudication/{item}/",
        {"decision": "validated", "note": "seen"},
        "note",
    ),
    (
        "adjudication-candidate-note",
        "boss",
        "POST",
        "/studies/{s}/adjudication/{item}/",
        {"candidate": "{image}", "accept": "1", "note": "seen"},
        "note",
    ),
    (
        "export-primary",
        "boss",
        "POST",
        "/studies/{s}/export/",
        {"policy": "primary", "primary": "ann", "format": "mbeir", "back": "/studies/{s}/progress/"},
        "primary",
    ),
    ("release-layout", "boss", "POST", "/studies/{s}/release/", {"layout": "cirval"}, "layout"),
    (
        "audit-new",
        "boss",
        "POST",
        "/audits/new/",
        {"dataset": "circo", "split": "val", "retrievers": "RN50:openai", "k": 10, "min_mm_retrievers": 1},
        "retrievers",
    ),
    (
        "dataset-import",
        "boss",
        "POST",
        "/datasets/import/",
        {"format": "circo", "name": "circo2", "split": "val", "images_root": "", "files": "FILE"},
        "split",
    ),
    (
        "admin-user-add",
        "root",
        "POST",
        "/admin/auth/user/add/",
        {"username": "x", "password1": "a-long-pass-1234", "password2": "a-long-pass-1234"},
        "username",
    ),
    ("api-study-create", "boss", "POST", "/api/studies/", {"name": "x", "datasets": "circo"}, "name"),
    (
        "api-judgement-note",
        "ann",
        "POST",
        "/api/assignments/{a}/judgements/",
        {"category": "VALIDATED", "time_spent_ms": 5, "note": "ok"},
        "note",
    ),
    ("api-draft-note", "ann", "PUT", "/api/assignments/{a}/draft/", {"note": "draft"}, "note"),
    (
        "api-interactive-round",
        "ann",
        "POST",
        "/api/assignments/{a}/interactive/rounds/",
        {"text": "make it red", "time_spent_ms": 5},
        "text",
    ),
]


@pytest.fixture
def world(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    ann = make_annotator("ann")
    make_annotator("bob")
    User = get_user_model()
    boss = User.objects.create_user("boss", password="pw", is_staff=True)
    root = User.objects.create_superuser("root", password="pw")
    study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=4, annotators=["ann"]))
    asg = engine.next_assignment(study, ann).assignment
    return {
        "users": {"ann": ann, "boss": boss, "root": root},
        "a": asg.pk,
        "s": study.pk,
        "item": asg.item_id,
        "image": Image.objects.first().pk,
        "ann_id": ann.pk,
        "uid": urlsafe_base64_encode(force_bytes(ann.pk)),
        "token": default_token_generator.make_token(ann),
    }


def rows() -> dict:
    """Every row of the project's tables, the users', the login lockout's and the tokens'."""
    labels = {"annotation", "audit", "retrieval", "auth", "axes", "authtoken"}
    return {
        m._meta.label: sorted(map(repr, m.objects.values_list()))
        for m in apps.get_models()
        if m._meta.app_label in labels
    }


def files() -> set[str]:
    """The files under the var folder the app writes (the databases aside)."""
    var = Path(settings.VAR_DIR)
    return {
        str(p.relative_to(var))
        for p in var.rglob("*")
        if p.is_file() and ".sqlite3" not in p.name and "log" not in p.relative_to(var).parts
    }


def client_for(world, who) -> Client:
    c = Client(REMOTE_ADDR="10.9.9.9")
    if who:
        c.force_login(world["users"][who])
    return c


def fill(template: str, world: dict) -> str:
    """``template`` with each ``{name}`` of ``world`` replaced (other braces stay: JSON)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(world.get(m.group(1), m.group(0))), template)


def multipart(world, fields: dict, field: str, char: str) -> dict:
    data = {}
    for name, value in fields.items():
        value = upload() if value == "FILE" else fill(value, world) if isinstance(value, str) else value
        data[name] = f"x{char}y" if name == field else value
    return data


def send(client: Client, method: str, url: str, data: dict):
    if method == "POST":
        return client.post(url, data)  # the test client sends a dict as multipart/form-data
    return client.generic(method, url, encode_multipart(BOUNDARY, data), MULTIPART_CONTENT)


@pytest.mark.parametrize("case,who,method,url,fields,field", CASES, ids=[c[0] for c in CASES])
def test_every_form_that_takes_text_refuses_nul_and_control_characters_in_a_multipart_body(
    world, case, who, method, url, fields, field
):
    client = client_for(world, who)
    url = fill(url, world)
    before, stored = rows(), files()
    for label, char in HOSTILE.items():
        resp = send(client, method, url, multipart(world, fields, field, char))
        assert resp.status_code == 400, (case, label, resp.status_code, resp.content[:300])
        answer = resp.json()
        assert (
            answer["field"] == field
            and f"U+{ord(char):04X}" in answer["detail"]
            or (char == "\x00" and "NUL" in answer["detail"])
        ), (case, label, answer)
        assert rows() == before, (case, label)
        assert files() == stored, (case, label)


def test_the_cases_reach_every_view_that_reads_a_form_body():
    """Every view that reads ``request.POST``, ``request.FILES`` or ``request.data`` has a case
    above (found in the source: a new view that takes text needs its case)."""
    readers = set()
    for app in ("annotation", "audit", "retrieval", "config"):
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for fn in ast.walk(tree):
                if isinstance(fn, ast.FunctionDef) and any(
                    isinstance(n, ast.Attribute)
                    and n.attr in ("POST", "FILES", "data")
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "request"
                    for n in ast.walk(fn)
                ):
                    readers.add(f"{module}.{fn.name}")
    world = {"ann_id": 1, "uid": "MQ", "token": "t", "s": 1, "item": 1, "image": 1, "a": 1}
    reached = set()
    for _, _, _, url, _, _ in CASES:
        func = resolve(fill(url, world)).func
        func = getattr(func, "view_class", func)
        reached.add(f"{func.__module__}.{func.__name__}")
    # helpers that read the body for a view above
    helpers = {
        "annotation.report_pages._decide_candidate",
        "annotation.report_pages._back",
        "annotation.api._json_object",
        "config.middleware.form_body",
        "config.middleware.check_fields",
    }
    assert readers - helpers <= reached, sorted(readers - helpers - reached)


def test_one_check_for_every_body_type(world):
    """The same judgement with a NUL, then an escape, in its note: URL-encoded, multipart and
    JSON bodies are all refused with 400 naming ``note``; nothing stored."""
    client = client_for(world, "ann")
    url = f"/api/assignments/{world['a']}/judgements/"
    before = rows()
    for char in HOSTILE.values():
        note = f"a{char}b"
        bodies = {
            "application/x-www-form-urlencoded": f"category=VALIDATED&note={note}".encode(),
            MULTIPART_CONTENT: encode_multipart(BOUNDARY, {"category": "VALIDATED", "note": note}),
            "application/json": json.dumps({"category": "VALIDATED", "time_spent_ms": 5, "note": note}).encode(),
        }
        for ctype, body in bodies.items():
            resp = client.generic("POST", url, body, ctype)
            assert resp.status_code == 400 and resp.json()["field"] == "note", (ctype, repr(char), resp.content)
    assert rows() == before


def test_tab_and_line_ends_are_text_and_file_contents_are_bytes(world):
    """A note may hold tabs and line ends (a textarea sends CRLF); an uploaded file may hold
    any byte, NUL included, and reaches the view."""
    client = client_for(world, "boss")
    resp = client.post(
        f"/studies/{world['s']}/adjudication/{world['item']}/",
        {"decision": "validated", "note": "one\tcell\r\nnext line"},
    )
    assert resp.status_code == 302, resp.content[:300]
    assert Adjudication.objects.get(item_id=world["item"]).note == "one\tcell\r\nnext line"
    jobs = ImportJob.objects.count()
    binary = upload("val.json", b'{"\x00": "\x1b"}\x00\xff\xfe')
    resp = client.post("/datasets/import/", {"format": "circo", "name": "circo2", "split": "val", "files": binary})
    assert resp.status_code == 302, resp.content[:300]  # the form took it: the job reads (and refuses) the file
    assert ImportJob.objects.count() == jobs + 1
    # a file's name keeps its printable characters only (Django's multipart parser): stored without the NUL
    named = upload("val\x00.json", b"{}")
    resp = client.post("/datasets/import/", {"format": "circo", "name": "circo3", "split": "val", "files": named})
    assert resp.status_code == 302 and ImportJob.objects.count() == jobs + 2
    assert "\\x00" not in repr(list(ImportJob.objects.values_list())) and not files_with("\x00")


def files_with(char: str) -> list[str]:
    return [name for name in files() if char in name]
