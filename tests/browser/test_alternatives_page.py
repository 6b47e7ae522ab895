"""Issue 13 acceptance: three annotators tick overlapping candidates of one item by keyboard;
the report shows the per-candidate alpha; the export holds exactly the majority-ticked
alternatives with their provenance. Screenshots of the panel at 1366x768 and 1920x1080."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from annotation.agreement.reports import annotator_pseudonyms
from annotation.alternatives.agreement import candidate_units, unit_agreement
from annotation.export.validated import export_study
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Judgement, RubricVersion, Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Image
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# keys each annotator presses on the panel (cursor starts on candidate 1), then 5 = VALIDATED
KEYS = {
    "ann1": [" ", "ArrowRight", " "],  # 1, 2
    "ann2": ["0", "ArrowRight", " ", "ArrowRight", " "],  # (none fit, then) 2, 3
    "ann3": [" ", "PageDown", " ", "PageUp", "ArrowDown", "ArrowUp", "End"],  # 1, 11
}
TICKED = {"ann1": [0, 1], "ann2": [1, 2], "ann3": [0, 10]}  # panel positions
MAJORITY = [0, 1]  # ticked by 2 of 3


@pytest.fixture
def one_item_study(tmp_path_factory, settings):
    images = tmp_path_factory.mktemp("alt-images")
    settings.IMAGE_ROOTS = [images.resolve()]
    settings.EMBEDDING_CACHE_DIR = images / "embeddings"
    settings.EXPORT_DIR = images / "exports"
    root = images / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=4, n_sessions=1), "demo", images_root=root)
    group = Group.objects.get_or_create(name="annotator")[0]  # a flush by an earlier transactional test drops it
    for name in KEYS:
        get_user_model().objects.create_user(name, password=f"{name}-pw").groups.add(group)
    get_user_model().objects.create_superuser("boss", password="boss-pw")
    clear_memos()
    study, _ = create_study(
        StudySpec(name="alts", datasets=["demo"], overlap=3, total=1, annotators=list(KEYS), candidates=20)
    )
    fill_study_candidates(study.pk)  # no audit: one retriever run on demand
    yield study
    clear_memos()


def judge(page, base: str, study: Study, name: str, keys: list[str], shots=None) -> None:
    login(page, base, name, f"{name}-pw")
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#candgrid .cand.cursor")
    for k in keys:
        page.keyboard.press(k)
    if shots:
        shots(page)
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/annotate/{study.pk}/?empty=queue_empty")  # its one item judged
    page.context.clear_cookies()


def test_three_annotators_tick_by_keyboard_report_and_export(page, live_server, one_item_study, shot, tmp_path):
    study = one_item_study
    item = StudyItem.objects.get(study=study)
    panel = list(item.candidates)
    assert len(panel) == 20

    # the too-broad hint from 2 ticks in this test: the rubric's setting (issue 39, item 3)
    rubric = study.rubric.rubric.to_dict()
    narrow = RubricVersion.objects.create(
        key="validity_narrow",
        version=1,
        title=rubric["title"],
        definition={**rubric, "key": "validity_narrow", "too_broad_threshold": 2},
    )
    Study.objects.filter(pk=study.pk).update(rubric=narrow)

    def shots(p):
        assert "served by" not in p.content()
        assert p.is_visible("#too-broad") and "QUERY_TOO_BROAD" not in p.inner_text("#too-broad")
        assert "Query too broad" in p.inner_text("#too-broad")
        assert p.inner_text("#cand-count") == "2 ticked"  # both pages of 20 open
        assert p.locator("#candgrid .cand:not([hidden])").count() == 10  # pages of 10
        for w, h in ((1366, 768), (1920, 1080)):
            p.set_viewport_size({"width": w, "height": h})
            shot(p, f"alternatives-item-{w}x{h}")

    for name, keys in KEYS.items():
        judge(page, live_server.url, study, name, keys, shots if name == "ann3" else None)
    ticks = {
        j.assignment.annotator.username: j.alternatives
        for j in Judgement.objects.filter(assignment__item=item, is_current=True).select_related(
            "assignment__annotator"
        )
    }
    assert ticks == {n: [panel[i] for i in pos] for n, pos in TICKED.items()}

    # the report shows the per-candidate alpha, the same number the pure function gives
    login(page, live_server.url, "boss", "boss-pw")
    page.goto(f"{live_server.url}/studies/{study.pk}/report/")
    expected = unit_agreement(candidate_units({item.pk: panel}, {item.pk: ticks}))["alpha_nominal"]
    assert page.inner_text("#alt-alpha") == f"{expected:.3f}"
    assert page.inner_text("#alt-units").startswith("20 · 60")
    assert "2: 1 query" in page.inner_text("#alt-distribution")
    page.set_viewport_size({"width": 1366, "height": 768})
    page.locator("#alternatives").scroll_into_view_if_needed()
    shot(page, "alternatives-report")

    check_export(study, item, panel, tmp_path)


def check_export(study, item, panel, tmp_path) -> None:
    # the export: exactly the majority-ticked alternatives, with their provenance
    result = export_study(Study.objects.get(pk=study.pk), tmp_path / "export")
    trace_file = next(p for p in (tmp_path / "export").rglob("*.trace.jsonl"))
    queries_file = trace_file.with_name(trace_file.name.replace(".trace.jsonl", ".jsonl"))
    trace = json.loads(trace_file.read_text().splitlines()[0])
    line = json.loads(queries_file.read_text().splitlines()[0])
    ext = dict(Image.objects.filter(pk__in=panel).values_list("pk", "external_id"))
    names = annotator_pseudonyms(study)
    alts = [p for p in trace["positives"] if p["source"] == "alternative"]
    assert [a["image"] for a in alts] == [ext[panel[i]] for i in MAJORITY]
    assert [a["ticked_by"] for a in alts] == [[names["ann1"], names["ann3"]], [names["ann1"], names["ann2"]]]
    assert all(a["votes"] == 2 and a["of"] == 3 and a["rule"] == "majority" for a in alts)
    labelled = [p["image"] for p in trace["positives"] if p["source"] == "labelled"]
    assert len(labelled) == 1 and line["pos_cand_list"] == labelled + [a["image"] for a in alts]
    assert result.manifest["counts"]["validated"] == 1

    # CIRCO layout: gt_img_ids = the labelled target first, then the alternatives
    export_study(Study.objects.get(pk=study.pk), tmp_path / "circo", fmt="circo")
    circo = json.loads(next((tmp_path / "circo").rglob("*.circo.json")).read_text())
    assert len(circo) == 1 and circo[0]["gt_img_ids"] == line["pos_cand_list"]
    assert circo[0]["target_img_id"] == labelled[0]
