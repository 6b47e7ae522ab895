"""Issue 39, item 1: reachable recall as the annotator meets it. An annotator who follows the
page's own rules (the first two pages are open and a page with a tick opens the two after it;
no page opened at will) and ticks every fitting candidate they are shown reaches exactly the
fitting images that :func:`annotation.alternatives.paging.reachable` (what ``demo_check``
reports) says. One panel is laid out by hand so that the rule is seen to go past an empty page
and to stop: none on page 1, fits on page 2, none on pages 3 and 4, one on page 5.
"""

from __future__ import annotations

import re

import pytest

from annotation.alternatives.paging import reachable
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Assignment, Judgement, StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from audit.runs.panels import batch_exclusions
from retrieval.demo import build_demo_world
from retrieval.demofit import other_fitting_images
from retrieval.loader import load_parsed
from retrieval.models import Image
from tests.browser.conftest import SHOTS, close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DEPTH = 50
LAID_OUT = [13, 17, 44]  # panel positions of the hand-laid fits: pages 2, 2 and 5


@pytest.fixture
def truth_study(tmp_path_factory, settings):
    from tests.conftest import make_annotator

    images = tmp_path_factory.mktemp("reach-images")
    settings.IMAGE_ROOTS = [images.resolve()]
    settings.EMBEDDING_CACHE_DIR = images / "embeddings"
    root = images / "demo"
    parsed, truth = build_demo_world(root, n_gallery=160, n_single=16, n_sessions=0)
    load_parsed(parsed, "demo", images_root=root)
    make_annotator("ann", "ann-pw")
    study, _ = create_study(StudySpec(name="reach", datasets=["demo"], overlap=1, annotators=["ann"], candidates=DEPTH))
    fill_study_candidates(study.pk)  # no audit: one retriever run on demand
    scenes = {e: x["scene"] for e, x in Image.objects.filter(dataset__name="demo").values_list("external_id", "extra")}
    pk_of = dict(Image.objects.filter(dataset__name="demo").values_list("external_id", "pk"))
    fits = {}
    for item in StudyItem.objects.filter(study=study).select_related("query"):
        fits[item.pk] = {pk_of[e] for e in other_fitting_images(truth["queries"][item.query.external_id], scenes)}
    # the too-broad query's panel, laid out by hand: its fits at LAID_OUT, the rest of the panel after
    broad = next(pk for pk, f in fits.items() if len(f) >= 10)
    item = StudyItem.objects.get(pk=broad)
    chosen = sorted(fits[broad])[: len(LAID_OUT)]
    banned = batch_exclusions([item.query_id])[item.query_id] | fits[broad]
    others = [c for c in [*item.candidates, *sorted(pk_of.values())] if c not in banned]
    others = list(dict.fromkeys(others))
    panel: list[int] = []
    for n in range(DEPTH):
        panel.append(chosen[LAID_OUT.index(n)] if n in LAID_OUT else others.pop(0))
    StudyItem.objects.filter(pk=broad).update(candidates=panel)
    yield study, fits, broad
    clear_memos()


def _tick_as_an_annotator(page, fits: set[int]) -> list[int]:
    """Tick every fitting candidate shown, page by page, while the page keeps a next one open."""
    ticked = []
    while True:
        for cand in page.locator("#candgrid .cand:not([hidden])").all():
            image = int(cand.get_attribute("data-id"))
            if image in fits:
                cand.locator(".candpick").click()
                ticked.append(image)
        now, opened = map(int, re.fullmatch(r"page (\d+) of (\d+)", page.inner_text("#cand-page")).groups())
        if opened <= now:  # the page opened no further page: the annotator is done
            return ticked
        page.keyboard.press("PageDown")


def test_an_annotator_reaches_what_reachable_recall_counts(browser, live_server, truth_study):
    study, fits, broad = truth_study
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_tab(browser, 1366, 768)
    reached: dict[int, list[int]] = {}
    try:
        login(page, live_server.url, "ann", "ann-pw")
        page.goto(f"{live_server.url}/annotate/{study.pk}/")
        page.wait_for_url(re.compile(r".*/annotate/\d+/(item/\d+/|\?empty=).*"))
        while True:
            page.wait_for_load_state("networkidle")
            match = re.search(r"/annotate/\d+/item/(\d+)/", page.url)
            if match is None:
                break
            item = Assignment.objects.get(pk=int(match.group(1))).item_id
            page.wait_for_selector("#candgrid .cand.cursor")
            reached[item] = _tick_as_an_annotator(page, fits[item])
            if item == broad:
                page.screenshot(path=str(SHOTS / "reachable-broad-1366x768.png"))
            page.keyboard.press("5")
            page.keyboard.press("Enter")
            page.wait_for_url(lambda url, was=page.url: url != was and re.search(r"/item/\d+/|\?empty=", url))
    finally:
        close_tab(page)
    panels = dict(StudyItem.objects.filter(study=study).values_list("pk", "candidates"))
    assert set(reached) == set(panels) == set(fits)
    for item, ticked in reached.items():
        assert ticked == reachable(panels[item], fits[item]), item
    # the hand-laid panel: page 1 brings no fit but page 2 is open and does; pages 3 and 4 bring
    # none, so page 5's fit is out of reach
    assert [panels[broad].index(i) for i in reached[broad]] == LAID_OUT[:2]
    stored = {
        j.assignment.item_id: j.alternatives
        for j in Judgement.objects.filter(assignment__study=study).select_related("assignment")
    }
    assert stored == reached
    total = sum(len(f & set(panels[i])) for i, f in fits.items())
    print(f"reachable in the browser: {sum(map(len, reached.values()))} of {total} fitting candidates in the panels")
