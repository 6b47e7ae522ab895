"""Acceptance of issue 26 item 4: an interactive study end to end, at 1366x768.

An annotator plays the user in the browser with the keyboard only (Enter sends, digits with
Alt pick a result, i inspects it); a real worker of the rounds' own queue (``interactive``)
re-ranks every round, and while only a worker of the other queues is alive the page says that
no worker is. The staff downloads
the sessions in the CIRCLED layout; they are re-imported as a dataset of their own (with the
demo's gallery), audited, and the session report shows them beside the demo's generated
sessions. A small demo world and the tiny retriever keep it quick."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from annotation.models import Assignment, InteractiveRound, InteractiveSession
from annotation.studies.building import StudySpec, create_study
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.jobs import workers
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from tests.browser.conftest import SHOTS, close_tab, login, open_tab
from tests.conftest import make_annotator, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SPEC = "openclip:cirval-tiny-vit"


def shots(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for w, h in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": w, "height": h})
        page.screenshot(path=str(SHOTS / f"{name}-{w}x{h}.png"))
    page.set_viewport_size({"width": 1366, "height": 768})


def audit(name: str):
    run = dispatch.run_inline(
        planning.create_run(Dataset.objects.get(name=name), [SPEC], chunk_queries=20, chunk_gallery=50)
    )
    assert run.status == "done", run.error
    return run


def write_round(page, text: str, rounds: int, timeout: float = 15000) -> None:
    page.keyboard.type(text)
    page.keyboard.press("Enter")
    page.wait_for_selector(f"body[data-rounds='{rounds}'][data-pending='0']", state="attached", timeout=timeout)


def test_an_interactive_study_end_to_end(browser, live_server, settings, tmp_path, worker_factory):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    settings.IMAGE_ROOTS = [root.resolve()]
    load_parsed(build_demo(root, n_gallery=40, n_single=6, n_sessions=4), "demo", images_root=root)
    clear_memos()
    make_annotator("ann", "ann-pw")
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("boss", password="boss-pw")
    study, _ = create_study(
        StudySpec(
            name="play the user",
            datasets=["demo"],
            overlap=1,
            annotators=["ann"],
            interactive={"retriever": SPEC, "top_n": 1, "max_rounds": 2},
        )
    )
    env = {"EMBEDDING_CACHE_DIR": str(settings.EMBEDDING_CACHE_DIR), "IMAGE_ROOTS": str(root.resolve())}
    # a worker of the other queues only: rounds go to their own queue, which it does not consume
    others = worker_factory(queues="celery,gpu", extra_env=env).start("jobs")
    wait_for(lambda: workers.alive("celery"), timeout=60, what=f"the jobs worker's beat\n{others.log()}")

    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "ann", "ann-pw")
        for n in range(2):  # two sessions, keyboard only
            page.goto(f"{live_server.url}/annotate/{study.pk}/")
            page.wait_for_selector("#interactive")
            assert page.evaluate("document.activeElement.id") == "feedback"
            if n == 0:
                shots(page, "interactive-start")
            if n == 0:  # no worker consumes the rounds' queue yet: the page says so, the round waits
                page.keyboard.type("make it bigger and red")
                page.keyboard.press("Enter")
                page.wait_for_selector("#status.error:has-text('No worker alive')", timeout=15000)
                assert InteractiveRound.objects.get(session__study=study).status == "pending"
                worker_factory(queues="interactive", extra_env=env).start("iact")
                # the worker's first round loads torch and the retriever: give it time
                page.wait_for_selector("body[data-rounds='1'][data-pending='0']", state="attached", timeout=120000)
                assert "No worker" not in page.inner_text("#status")
            else:
                write_round(page, "make it bigger and red", 1)
            if page.evaluate("document.body.dataset.ended") == "1":
                continue
            assert page.locator("#results .iact-cand").count() == 1  # top N = 1 result shown
            page.keyboard.press("Alt+1")  # pick result 1 while typing
            page.keyboard.press("Alt+i")  # inspect it beside the target
            assert page.is_visible("#inspect")
            assert page.eval_on_selector("#inspect-img", "img => img.decode().then(() => img.naturalWidth)") > 0
            if n == 0:
                shots(page, "interactive-inspect")
            page.keyboard.press("Escape")
            assert page.is_hidden("#inspect")
            picked = int(page.get_attribute("#results .iact-cand.picked", "data-id"))
            if n == 0:
                shots(page, "interactive-round1")
                # at 1366x768 the target, the feedback box and ten results (the default N) fit unscrolled
                layout = page.evaluate("""() => {
                    const grid = document.getElementById('results');
                    const copies = [];
                    for (let i = 1; i < 10; i++) { const c = grid.firstElementChild.cloneNode(true); copies.push(c); grid.append(c); }
                    const bottom = (id) => document.getElementById(id).getBoundingClientRect().bottom;
                    const out = {target: bottom('target-img'), feedback: bottom('send'), results: bottom('results'),
                                 width: document.documentElement.scrollWidth, height: window.innerHeight};
                    copies.forEach((c) => c.remove());
                    return out; }""")
                assert layout["height"] == 768 and layout["width"] <= 1366, layout
                assert max(layout["target"], layout["feedback"], layout["results"]) <= 768, layout
            write_round(page, "now with two blue circles", 2)
            assert page.evaluate("document.body.dataset.ended") == "1"
            session = InteractiveSession.objects.filter(study=study).order_by("-id").first()
            assert session.rounds.get(index=2).reference_id == picked  # the picked result is turn 2's reference
            assert session.outcome in ("found", "rounds")
            if n == 0:
                shots(page, "interactive-ended")
        assert (
            "not found" in page.inner_text("#ended-text").lower() or "found" in page.inner_text("#ended-text").lower()
        )
    finally:
        close_tab(page)

    rounds = list(InteractiveRound.objects.filter(session__study=study).order_by("session", "index"))
    assert len(rounds) >= 2 and all(r.status == "done" for r in rounds)
    assert all(r.shown and r.target_rank and r.rank_ms and r.ranked_at and r.time_spent_ms > 0 for r in rounds)
    assert {r.text for r in rounds} <= {"make it bigger and red", "now with two blue circles"}
    assert Assignment.objects.filter(study=study, status="done").count() == 2
    multi = InteractiveSession.objects.filter(study=study, rounds__index=2).distinct().count()
    assert multi >= 1

    # the staff downloads the sessions (CIRCLED layout) ...
    staff = open_tab(browser, 1366, 768)
    try:
        login(staff, live_server.url, "boss", "boss-pw")
        staff.goto(f"{live_server.url}/studies/{study.pk}/progress/")
        assert "Sessions written" in staff.inner_text("#interactive-summary")
        shots(staff, "interactive-study-progress")
        with staff.expect_download() as download:
            staff.click("#export-sessions")
        path = tmp_path / download.value.suggested_filename
        download.value.save_as(path)
    finally:
        close_tab(staff)
    records = json.loads(path.read_text())
    assert path.name == "demo_val.json" and len(records) == 2
    assert all(t["provenance"] == "human" for r in records for t in r["turns"])

    # ... which re-import as a dataset of their own over the demo's gallery, and are audited
    call_command(
        "import_dataset",
        "--format",
        "circled",
        "--name",
        "demo-people",
        "--images-root",
        str(root),
        str(path),
        verbosity=0,
    )
    call_command(
        "import_gallery", "--dataset", "demo-people", "--split", "val", "--folder", str(root / "gallery"), verbosity=0
    )
    people = Dataset.objects.get(name="demo-people")
    assert people.gallery.count() == Dataset.objects.get(name="demo").gallery.count()
    assert not people.images.filter(missing=True).exists()
    assert Query.objects.filter(dataset=people, n_turns__gt=1).count() == multi
    # validated like any other: a session study takes them
    validation, report = create_study(
        StudySpec(name="judge them", datasets=["demo-people"], rubric="session", overlap=1)
    )
    assert report["items"] == multi
    generated = audit("demo")
    written = audit("demo-people")
    assert written.summary["sessions"]["n_sessions"] == multi

    # the session report shows them beside the generated ones
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "boss", "boss-pw")
        page.goto(f"{live_server.url}/audits/{written.pk}/?compare=#sessions-compare")  # chosen: none
        assert page.locator("#compare-table tbody tr").count() == 1
        # by default the audit of the dataset whose gallery the sessions were written over stands beside them
        page.goto(f"{live_server.url}/audits/{written.pk}/#sessions-compare")
        table = page.locator("#compare-table tbody tr")
        groups = [table.nth(i).get_attribute("data-group") for i in range(table.count())]
        assert groups == ["written by people", "generated"]
        assert [table.nth(i).get_attribute("data-run") for i in range(2)] == [str(written.pk), str(generated.pk)]
        assert page.locator("#sessions-compare svg").count() == 2
        text = page.inner_text("#sessions-compare")
        assert "demo-people" in text and "Rank curve" in page.inner_html("#sessions-compare")
        page.locator("#sessions-compare").scroll_into_view_if_needed()
        page.evaluate("""() => { for (const el of document.querySelectorAll('main > *'))
            if (el.id !== 'sessions-compare') el.style.display = 'none'; }""")
        shots(page, "interactive-compare")
    finally:
        close_tab(page)
