"""Every URL and API endpoint against every role: anonymous, annotator, another study's
annotator, researcher, staff. A new URL must be added to the table to pass."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from annotation.assignment import queue as engine
from annotation.models import ExportJob, ReleaseJob, RoomImportJob
from annotation.studies.building import StudySpec, create_study
from audit.models import Leaderboard
from audit.runs.planning import create_run
from retrieval.models import Dataset, ImportJob, Query
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db
ROLES = ("anon", "member", "outsider", "researcher", "staff")
LOGIN = "login"  # a redirect to the login page
PAGE_DENY = 403
API_DENY = (401, 403)


def all_url_names() -> set[str]:
    names: set[str] = set()

    def walk(resolver, ns=""):
        for p in resolver.url_patterns:
            if isinstance(p, URLResolver):
                walk(p, f"{ns}{p.namespace}:" if p.namespace else ns)
            elif isinstance(p, URLPattern) and p.name:
                names.add(ns + p.name)

    walk(get_resolver())
    return {n for n in names if not n.startswith("admin:")}


@pytest.fixture
def world(tmp_path):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    User = get_user_model()
    users = {
        "member": make_annotator("member"),
        "outsider": make_annotator("outsider"),
        "researcher": User.objects.create_user("res", password="pw"),
        "staff": User.objects.create_user("boss", password="pw", is_staff=True),
    }
    for role in ("member", "outsider"):
        users[role].groups.add(Group.objects.get(name="annotator"))
    users["researcher"].groups.add(Group.objects.get(name="researcher"))
    study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=4, annotators=["member"]))
    create_study(StudySpec(name="t", datasets=["circo"], overlap=1, total=4, seed=1, annotators=["outsider"]))
    asg = engine.next_assignment(study, users["member"]).assignment
    run = create_run("circo", ["openclip:cirval-tiny-vit"])
    job = ImportJob.objects.create(dataset_name="x", format="circo")
    (tmp_path / "manifest.json").write_text("{}")
    export = ExportJob.objects.create(study=study, status="done", path=str(tmp_path), files=["manifest.json"])
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "README.md").write_text("card")
    (tmp_path / "rel.zip").write_bytes(b"PK")
    release = ReleaseJob.objects.create(
        study=study, study_ids=[study.pk], status="done", path=str(tmp_path / "rel"), files=["README.md"]
    )
    return {
        "users": users,
        "study": study,
        "asg": asg,
        "run": run,
        "job": job,
        "export": export,
        "release": release,
        "room_import": RoomImportJob.objects.create(command=RoomImportJob.RANKS, names=["r.json"], status="done"),
        "query": Query.objects.filter(dataset__name="circo").first(),
        # an image of the item served to the member (annotators fetch only what they were shown)
        "image": asg.item.query.turns.first().reference_image,
        "item": asg.item,
        # a leaderboard with no method yet: its page says so (the scored table has its own tests)
        "board": Leaderboard.objects.create(dataset=Dataset.objects.get(name="circo"), split="val", name="b"),
    }


def table(w):
    s, a = w["study"].pk, w["asg"].pk
    ok, deny = 200, PAGE_DENY
    # name: (method, kwargs, {role: expected status or set})
    everyone = {r: ok for r in ROLES[1:]}
    page_staff = {"member": deny, "outsider": deny, "researcher": deny, "staff": ok}
    page_research = {"member": deny, "outsider": deny, "researcher": ok, "staff": ok}
    return {
        "home": ("GET", {}, everyone),
        "login": ("GET", {}, {"anon": ok, **{r: 302 for r in ROLES[1:]}}),
        "logout": ("POST", {}, {"anon": 302, **{r: 302 for r in ROLES[1:]}}),
        "healthz": ("GET", {}, {r: {ok, 503} for r in ROLES}),  # 503: the world's import waits, no worker
        "api-schema": ("GET", {}, {"member": 403, "outsider": 403, "researcher": ok, "staff": ok}),
        "retrieval:dataset_list": ("GET", {}, page_research),
        "retrieval:dataset_detail": ("GET", {"name": "circo"}, page_research),
        "retrieval:query_detail": ("GET", {"name": "circo", "pk": w["query"].pk}, page_research),
        "retrieval:image": ("GET", {"pk": w["image"].pk}, {**everyone, "outsider": 404}),
        "retrieval:import": ("GET", {}, page_staff),
        "retrieval:import_job": ("GET", {"pk": w["job"].pk}, page_staff),
        "retrieval:import_job_status": ("GET", {"pk": w["job"].pk}, page_staff),
        "audit:list": ("GET", {}, page_research),
        "audit:new": ("GET", {}, {**page_research, "researcher": deny}),
        "audit:detail": ("GET", {"pk": w["run"].pk}, page_research),
        "audit:status": ("GET", {"pk": w["run"].pk}, page_research),
        "annotation:my_studies": ("GET", {}, everyone),
        "annotation:work": ("GET", {"study_id": s}, {"member": 302, "outsider": 404, "researcher": 404, "staff": 404}),
        "annotation:item": (
            "GET",
            {"study_id": s, "assignment_id": a},
            {"member": ok, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:history": (
            "GET",
            {"study_id": s},
            {"member": ok, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:upcoming": (
            "GET",
            {"study_id": s},
            {"member": ok, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:study_list": ("GET", {}, page_staff),
        "annotation:study_new": ("GET", {}, page_staff),
        "annotation:study_progress": ("GET", {"study_id": s}, page_staff),
        "annotation:report_list": ("GET", {}, page_research),
        "annotation:report": ("GET", {"study_id": s}, page_research),
        "annotation:report_json": ("GET", {"study_id": s}, page_research),
        "annotation:report_csv": ("GET", {"study_id": s}, page_research),
        "annotation:adjudication": ("GET", {"study_id": s}, page_staff),
        "annotation:adjudication_item": ("GET", {"study_id": s, "item_id": w["item"].pk}, page_staff),
        "annotation:export_list": ("GET", {"study_id": s}, page_staff),
        "annotation:export_start": ("POST", {"study_id": s}, {**page_staff, "staff": 302}),
        "annotation:export_job": ("GET", {"pk": w["export"].pk}, page_staff),
        "annotation:export_job_status": ("GET", {"pk": w["export"].pk}, page_staff),
        "annotation:export_file": ("GET", {"pk": w["export"].pk, "name": "manifest.json"}, page_staff),
        "annotation:release_start": ("POST", {"study_id": s}, {**page_staff, "staff": 302}),
        "annotation:release_job": ("GET", {"pk": w["release"].pk}, page_staff),
        "annotation:release_job_status": ("GET", {"pk": w["release"].pk}, page_staff),
        "annotation:release_file": ("GET", {"pk": w["release"].pk, "name": "README.md"}, page_staff),
        "annotation:release_zip": ("GET", {"pk": w["release"].pk}, page_staff),
        "annotation:api_studies": ("GET", {}, everyone),
        "annotation:api_study": ("GET", {"pk": s}, {"member": ok, "outsider": 404, "researcher": ok, "staff": ok}),
        "annotation:api_next": ("POST", {"pk": s}, {"member": ok, "outsider": 404, "researcher": 403, "staff": 403}),
        "annotation:api_progress": ("GET", {"pk": s}, {"member": ok, "outsider": 404, "researcher": 403, "staff": ok}),
        "annotation:api_assignments": ("GET", {}, everyone),
        "annotation:api_assignment": (
            "GET",
            {"pk": a},
            {"member": ok, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:api_draft": ("PUT", {"pk": a}, {"member": ok, "outsider": 404, "researcher": 404, "staff": 404}),
        "annotation:api_lease": ("POST", {"pk": a}, {"member": ok, "outsider": 404, "researcher": 404, "staff": 404}),
        "annotation:api_skip": ("POST", {"pk": a}, {"member": ok, "outsider": 404, "researcher": 404, "staff": 404}),
        "annotation:api_judgements": (
            "GET",
            {"pk": a},
            {"member": ok, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:study_suspicion": ("GET", {"study_id": s}, page_staff),
        # a study that is not interactive has no sessions to download (404), and only staff learn that
        "annotation:interactive_export": ("GET", {"study_id": s}, {**page_staff, "staff": 404}),
        # the member's own item is not from an interactive study: 400 says so; nobody else sees it
        "annotation:api_interactive": (
            "GET",
            {"pk": a},
            {"member": 400, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:api_interactive_rounds": (
            "POST",
            {"pk": a},
            {"member": 400, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "annotation:api_interactive_retry": (
            "POST",
            {"pk": a},
            {"member": 400, "outsider": 404, "researcher": 404, "staff": 404},
        ),
        "room:users": ("GET", {}, page_staff),
        "room:user_update": ("POST", {"user_id": w["users"]["member"].pk}, {**page_staff, "staff": 302}),
        "room:invite": ("GET", {"uidb64": "MQ", "token": "bad-token"}, {"anon": ok, **everyone}),
        "room:study": ("GET", {"study_id": s}, page_staff),
        "room:study_settings": ("POST", {"study_id": s}, page_staff),  # an empty form: shown again with errors
        "room:study_annotators": ("POST", {"study_id": s}, {**page_staff, "staff": 302}),
        "room:study_status": ("POST", {"study_id": s}, {**page_staff, "staff": 302}),
        "room:study_gold": ("POST", {"study_id": s}, {**page_staff, "staff": 302}),
        "room:jobs": ("GET", {}, page_staff),
        "room:jobs_json": ("GET", {}, page_staff),
        "room:imports": ("GET", {}, page_staff),
        "room:import_job": ("GET", {"pk": w["room_import"].pk}, page_staff),
        "room:import_job_status": ("GET", {"pk": w["room_import"].pk}, page_staff),
        "room:audit_retry": ("POST", {"run_id": w["run"].pk}, {**page_staff, "staff": 302}),
        "audit:leaderboards": ("GET", {}, page_research),
        "audit:leaderboard": ("GET", {"pk": w["board"].pk}, page_research),
        # the world's study samples no estimate: staff learn that (404), nobody else sees the page
        "annotation:study_estimate": ("GET", {"study_id": s}, {**page_staff, "staff": 404}),
    }


def test_every_url_is_in_the_table(world):
    assert all_url_names() == set(table(world))


def test_permission_matrix(world):
    failures = []
    for name, (method, kwargs, expected) in table(world).items():
        url = reverse(name, kwargs=kwargs)
        for role in ROLES:
            client = Client()
            if role != "anon":
                client.force_login(world["users"][role])
            if method == "PUT":
                resp = client.put(url, '{"note": "x"}', content_type="application/json")
            elif method == "POST":
                resp = client.post(url, {})
            else:
                resp = client.get(url)
            want = expected.get(role)
            if role == "anon" and want is None:
                ok = (resp.status_code == 302 and "/login/" in resp["Location"]) or resp.status_code in API_DENY
            elif isinstance(want, (set, tuple)):
                ok = resp.status_code in want
            else:
                ok = resp.status_code == want
            if not ok:
                failures.append(f"{name} {method} as {role}: {resp.status_code}, expected {want or 'login/401/403'}")
    assert not failures, "\n".join(failures)


def test_csrf_is_enforced_on_every_form(world):
    forms = [
        "/login/",
        "/logout/",
        "/datasets/import/",
        "/studies/new/",
        "/audits/new/",
        reverse("annotation:export_start", args=[world["study"].pk]),
        reverse("annotation:adjudication_item", args=[world["study"].pk, world["item"].pk]),
        reverse("annotation:api_judgements", args=[world["asg"].pk]),
        reverse("annotation:api_draft", args=[world["asg"].pk]),
    ]
    for url in forms:
        client = Client(enforce_csrf_checks=True)
        client.force_login(world["users"]["staff" if "api/" not in url else "member"])
        resp = (
            client.put(url, "{}", content_type="application/json") if url.endswith("draft/") else client.post(url, {})
        )
        assert resp.status_code == 403, (url, resp.status_code)
