"""Issue 39, item 7: an accessible workbench. axe-core (the npm package) runs on every page an
annotator, a staff member and a researcher open, found by following each one's links from the
home page (plus the pages reached by hand: the item pages, the error pages, login), with 0
serious or critical violations; every page has an h1 and a skip link; every candidate is
reached with Tab and ticked with Space."""

from __future__ import annotations

from io import StringIO
from urllib.parse import urldefrag, urlparse

import pytest
from django.core.management import call_command
from django.urls import Resolver404, resolve

from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import ExportJob, ReleaseJob, Study
from audit.models import AuditRun
from audit.runs.encoding import clear_memos
from retrieval.models import ImportJob
from tests.browser.axe import axe_violations
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Links not followed: downloads, JSON endpoints, the Django admin (not the app's pages), and
# the endpoints pages poll.
SKIPPED = {
    "logout",
    "api-schema",
    "healthz",
    "report_json",
    "report_csv",
    "export_file",
    "release_zip",
    "release_file",
    "image",
    "upcoming",
    "interactive_export",
    "export_job_status",
    "release_job_status",
    "import_job_status",
    "jobs_json",
    "status",
}
PER_NAME = 2  # pages of one URL name checked (a list's first rows)

# The pages each role must reach by its links (the walk fails if one is missed).
MUST_REACH = {
    "annotator": {"home", "my_studies", "item", "history"},
    "admin": {
        "home",
        "study_list",
        "study_new",
        "study_progress",
        "study_suspicion",
        "report_list",
        "report",
        "adjudication",
        "export_list",
        "users",
        "study",
        "jobs",
        "imports",
        "import",
        "dataset_list",
        "dataset_detail",
        "query_detail",
        "list",
        "detail",
        "new",
        "export_job",
        "release_job",
        "import_job",
    },
    "researcher": {"home", "dataset_list", "dataset_detail", "query_detail", "list", "detail", "report_list", "report"},
}

PAGE_CHECK = """() => ({
  h1: document.querySelectorAll('h1').length,
  skip: !!document.querySelector('a.skip[href="#main"]') && !!document.getElementById('main'),
  links: Array.from(document.querySelectorAll('a[href]')).map((a) => a.href),
})"""


@pytest.fixture
def audited_demo(db, demo_images, demo_embeddings, settings):
    """The demo with an audit (its report pages) by a tiny random retriever, run here, and the
    validity study's panels filled."""
    settings.IMAGE_ROOTS = [demo_images.resolve()]
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), "--no-audit", verbosity=0)
    clear_memos()
    call_command(
        "run_audit",
        "--dataset",
        "demo",
        "--retriever",
        "openclip:cirval-tiny-vit",
        "--eager",
        "--wait",
        stdout=StringIO(),
        stderr=StringIO(),
    )
    fill_study_candidates(Study.objects.get(name="demo-validity").pk)
    yield AuditRun.objects.get(dataset__name="demo")
    clear_memos()


def url_name(base: str, url: str) -> str | None:
    """The URL name of a page of this site, or None for another site, a skipped link or no page."""
    parts = urlparse(url)
    if f"{parts.scheme}://{parts.netloc}" != base:
        return None
    try:
        name = resolve(parts.path).url_name
    except Resolver404:
        return None
    return None if name in SKIPPED or parts.path.startswith(("/admin/", "/api/", "/static/")) else name


def check_page(page, problems: list[str], where: str) -> list[str]:
    """axe, the h1 and the skip link of the page now shown; its links."""
    page.wait_for_load_state("networkidle")
    found = page.evaluate(PAGE_CHECK)
    if not found["h1"]:
        problems.append(f"{where}: no h1")
    if not found["skip"]:
        problems.append(f"{where}: no skip link to #main")
    problems.extend(f"{where}: {v}" for v in axe_violations(page))
    return found["links"]


def walk(page, base: str, problems: list[str], extra: list[str] = ()) -> set[str]:
    """Every page reachable by links from the home page, PER_NAME of a name, and every page of
    ``extra`` (each study's work page lands on an item page of its own kind)."""
    queue, seen, per_name = [f"{base}/", *extra], set(), {}
    while queue:
        url = urldefrag(queue.pop(0))[0]
        name = url_name(base, url)
        if url in seen or name is None or (per_name.get(name, 0) >= PER_NAME and url not in extra):
            continue
        seen.add(url)
        response = page.goto(url)
        if response is None or response.status >= 400:
            problems.append(f"{url}: {response.status if response else 'no response'}")
            continue
        landed = url_name(base, page.url)  # a page that redirects (work -> item) counts as where it lands
        per_name[name] = per_name.get(name, 0) + 1
        if landed and landed != name:
            per_name[landed] = per_name.get(landed, 0) + 1
        queue.extend(check_page(page, problems, page.url.replace(base, "")))
        print("axe checked", page.url.replace(base, ""))  # the pages walked (pytest -s shows them)
    return set(per_name)


def job_pages(base: str) -> list[str]:
    """An export, a release and a dataset import, queued, and their pages."""
    study = Study.objects.get(name="demo-validity")
    export = ExportJob.objects.create(study=study)
    release = ReleaseJob.objects.create(study=study, study_ids=[study.pk])
    upload = ImportJob.objects.create(dataset_name="more")
    return [f"{base}/exports/{export.pk}/", f"{base}/releases/{release.pk}/", f"{base}/datasets/imports/{upload.pk}/"]


def test_axe_finds_nothing_serious_on_any_page(page, live_server, audited_demo):
    """One demo world, walked in turn as an annotator, the admin and a researcher."""
    base = live_server.url
    problems: list[str] = []
    page.goto(f"{base}/login/")
    check_page(page, problems, "/login/")
    for user, role in (("annotator1", "annotator"), ("admin", "admin"), ("researcher", "researcher")):
        page.context.clear_cookies()
        login(page, base, user, f"{user}-demo")
        extra = []
        if role == "annotator":  # each study's work page serves an item (validity with its panel, session, interactive)
            extra = [f"{base}/annotate/{pk}/" for pk in Study.objects.order_by("pk").values_list("pk", flat=True)]
            assert Study.objects.filter(name="demo-interactive").exists()  # its item page is walked too
        if role == "admin":  # the job pages a staff member follows (queued: no worker runs here)
            extra = job_pages(base)
        reached = walk(page, base, problems, extra)
        assert MUST_REACH[role] <= reached, (
            f"{user} missed {sorted(MUST_REACH[role] - reached)} (reached {sorted(reached)})"
        )
        page.goto(f"{base}/no-such-page/")
        check_page(page, problems, f"404 page ({user})")
        if role == "annotator":  # a staff page: the 403 page
            assert page.goto(f"{base}/studies/").status == 403
            check_page(page, problems, "403 page")
    assert problems == [], "\n".join(problems)
