"""Issue 10, item 1: over a whole demo study, the candidate panel an annotator sees depends
neither in content nor in size on the item's hidden audit category."""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from rest_framework.test import APIClient
from scipy.stats import chi2_contingency, fisher_exact

from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Study
from annotation.roles import ANNOTATOR
from audit.models import AuditLabel, AuditRank
from audit.runs.panels import candidate_panel, latest_pool_rankings
from retrieval.models import Target, Turn
from tests.conftest import TRAINED_STEPS

pytestmark = pytest.mark.django_db

CATEGORIES = ("composition_required", "unresolved")


@pytest.fixture(params=[64])
def demo_study(request, settings, trained_demo_models, demo_images, demo_embeddings):
    # retrievers trained long enough that the audit finds both shortcut-free categories
    # (2-step models leave almost every query unresolved): trained once for the session
    settings.DEMO_MODELS_DIR, settings.DEMO_TRAIN_STEPS = trained_demo_models, TRAINED_STEPS
    settings.IMAGE_ROOTS = [demo_images.resolve()]  # the world drawn once per session, its embeddings cached
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    # the audit's top-list size (AUDIT_CANDIDATES_N = 64 by default once every run stores it;
    # 10 before): blind either way, mostly padded with 10
    settings.AUDIT_PANEL_K = settings.AUDIT_CANDIDATES_N = request.param
    call_command("make_demo", "--images-dir", str(demo_images), stdout=StringIO())
    study = Study.objects.get(name="demo-validity")
    fill_study_candidates(study.pk)
    return study


def _independent(rows: dict[str, Counter]) -> bool:
    """True when a feature is independent of the category at the 5 % level (or constant)."""
    values = sorted({v for c in rows.values() for v in c})
    if len(values) < 2:
        return True
    table = [[rows[c][v] for v in values] for c in CATEGORIES]
    return chi2_contingency(table).pvalue >= 0.05


@pytest.mark.parametrize("demo_study", [10, 64], indirect=True)
def test_the_panel_is_blind_to_the_hidden_category(demo_study):
    study = demo_study
    items = list(study.items.select_related("query"))
    by_cat = Counter(i.hidden_category for i in items)
    assert set(by_cat) == set(CATEGORIES) and min(by_cat.values()) >= 5, by_cat
    size, contains_target, padded, old_contains = ({c: Counter() for c in CATEGORIES} for _ in range(4))
    for item in items:
        cat = item.hidden_category
        targets = set(Target.objects.filter(query=item.query).values_list("image_id", flat=True))
        ref = Turn.objects.get(query=item.query).reference_image_id
        panel = list(item.candidates)
        assert len(panel) == len(set(panel)) == study.candidates == 50
        assert not targets & set(panel) and ref not in panel
        size[cat][len(panel)] += 1
        contains_target[cat][bool(targets & set(panel))] += 1
        _run, rankings = latest_pool_rankings([item.query_id])[item.query_id]
        again = candidate_panel(item.query, rankings, study.candidates)
        assert again.ids == panel  # stored panel = the one function's answer
        padded[cat][again.padded] += 1
        # the old panel (union of every retriever's multimodal top-10) for contrast
        old_tops = AuditRank.objects.filter(query=item.query, run_id=_run).values_list("top_mm", flat=True)
        old_contains[cat][bool(targets & {i for top in old_tops for i in top[:10]})] += 1
    assert all(_independent(f) for f in (size, contains_target, padded)), (size, contains_target, padded)
    # the same test catches the old panel's leak: the target is always shown for
    # composition_required (and, but for a target tied with a tenth image or one that does not
    # count under the target rule, never for unresolved)
    table = [[old_contains[c][True], old_contains[c][False]] for c in CATEGORIES]
    assert table[0][1] <= 1 and fisher_exact(table).pvalue < 1e-3, table  # one tie on the issue-39 demo world


def test_the_panel_reads_neither_label_nor_ranks(demo_study):
    """Relabel every item and scramble the audit's target ranks: every panel stays the same."""
    study = demo_study
    before = {i.pk: list(i.candidates) for i in study.items.all()}
    AuditRank.objects.update(mm=1, text=None, image=None)
    AuditLabel.objects.update(label="shortcut_solvable")
    for item in study.items.select_related("query"):
        _run, rankings = latest_pool_rankings([item.query_id])[item.query_id]
        assert candidate_panel(item.query, rankings, study.candidates).ids == before[item.pk]


def test_annotators_see_the_panel_but_never_the_rule_or_the_source(demo_study, client):
    study = demo_study
    user = get_user_model().objects.get(username="annotator1")
    api = APIClient()
    api.force_authenticate(user)
    body = api.post(f"/api/studies/{study.pk}/next/").json()
    item = study.items.get(assignments__pk=body["assignment"])
    assert [p["id"] for p in body["panel"]] == item.candidates
    text = json.dumps(body)
    for secret in ("served_by", "agreement_subset", "panel_source", "audit ", *CATEGORIES):
        assert secret not in text, secret
    client.force_login(user)
    upcoming = client.get(f"/annotate/{study.pk}/upcoming/").json()["images"]
    assert sum(1 for u in upcoming if u.endswith("?size=160")) == 10  # the next item's first panel page
    page = client.get(f"/annotate/{study.pk}/", follow=True)
    html = page.content.decode()
    assert 'id="candgrid"' in html and html.count('class="cand"') == study.candidates
    assert "served by" not in html and "served_by" not in html and "agreement_subset" not in html
    # staff see both, in the API's staff view and on the page
    admin = get_user_model().objects.get(username="admin")
    admin.groups.add(Group.objects.get_or_create(name=ANNOTATOR)[0])  # next is served to annotators only
    study.annotators.add(admin)
    api.force_authenticate(admin)
    staff = api.post(f"/api/studies/{study.pk}/next/").json()
    assert staff["staff"]["served_by"] and staff["staff"]["panel_source"].startswith("audit ")
    client.force_login(admin)
    assert "served by" in client.get(f"/annotate/{study.pk}/", follow=True).content.decode()


def test_annotators_never_see_the_suspicion_score_nor_the_serving_order(demo_study, client):
    """Issue 25: a study served by suspicion tells its annotators nothing of it: no score, no
    part, no serving order in the item payload, the study API or the pages; the staff's
    suspicion page is closed to them."""
    study = demo_study
    study.serve_order = Study.ServeOrder.SUSPICION
    study.save(update_fields=["serve_order"])
    scored = list(study.items.filter(suspicion_parts__scored=True))
    assert scored and len({i.suspicion for i in scored}) > 1  # make_demo stored the scores
    user = get_user_model().objects.get(username="annotator1")
    api = APIClient()
    api.force_authenticate(user)
    body = api.post(f"/api/studies/{study.pk}/next/").json()
    item = study.items.get(assignments__pk=body["assignment"])
    assert item.suspicion == max(i.suspicion for i in study.items.filter(agreement=False, gold=False)) or item.agreement
    texts = [
        json.dumps(body),
        json.dumps(api.get(f"/api/assignments/{body['assignment']}/").json()),
        json.dumps(api.get(f"/api/studies/{study.pk}/").json()),
        json.dumps(api.get("/api/studies/").json()),
        json.dumps(api.get(f"/api/studies/{study.pk}/progress/").json()),
    ]
    client.force_login(user)
    for url in (f"/annotate/{study.pk}/", f"/annotate/{study.pk}/history/", "/annotate/"):
        texts.append(client.get(url, follow=True).content.decode())
    secrets = ("suspicion", "serve_order", "rivals", "consistency", repr(item.suspicion))
    for text in texts:
        for secret in secrets:
            assert secret not in text, secret
    assert client.get(f"/studies/{study.pk}/suspicion/").status_code in (302, 403)


def _multimodal_only_recall(truth: dict) -> dict:
    """Pool recall of the panel as it was before the pool (issue 25's "7 of 41"): each
    retriever's multimodal top list only, 20 deep, through the same panel function."""
    from audit.runs.panels import batch_exclusions, candidate_panel
    from retrieval.demofit import pool_recall
    from retrieval.models import Image, Query

    queries = {q.pk: q for q in Query.objects.filter(dataset__name="demo", n_turns=1)}
    excluded = batch_exclusions(list(queries))
    lists: dict[int, list[list[int]]] = {}
    for qid, top in (
        AuditRank.objects.filter(query_id__in=queries).order_by("retriever").values_list("query_id", "top_mm")
    ):
        lists.setdefault(qid, []).append(list(top))
    ext = dict(Image.objects.filter(dataset__name="demo").values_list("pk", "external_id"))
    scenes = {e: x["scene"] for e, x in Image.objects.filter(dataset__name="demo").values_list("external_id", "extra")}
    pools = {
        queries[q].external_id: {ext[i] for i in candidate_panel(queries[q], ls, 20, exclude=excluded[q]).ids}
        for q, ls in lists.items()
    }
    return pool_recall(truth["queries"], scenes, pools)


def test_the_demo_pool_holds_most_images_that_fit(demo_study):
    """Issue 25, item 1: the pool (every retriever's lists in three modalities and the images
    near the target and the reference, fused into a 50-deep panel) against the gallery images
    that fit a query besides its labelled target, by the demo's scene truth (``demo_check``'s
    "pool recall"), over every audited query of the demo. With the demo's own training (500
    and 400 steps) it holds 0.85 of them; these retrievers are trained for TRAINED_STEPS only
    (shared with test_suspicion), so the test asserts a lower floor and the gain over the
    panel before the pool (multimodal lists, 20 deep), computed on the same audit."""
    from annotation.studies.truth import truth_path

    out = StringIO()
    call_command("demo_check", "--format", "json", stdout=out)
    pool = json.loads(out.getvalue())["pool"]
    audited = pool["audited"]
    before = _multimodal_only_recall(json.loads(truth_path("demo").read_text()))
    print(
        "pool recall",
        json.dumps(
            {
                "panels": {k: pool[k] for k in ("queries", "fitting", "found", "recall")},
                "audited": audited,
                "before": before,
            }
        ),
    )
    assert pool["queries"] == demo_study.items.count() and audited["queries"] == 160
    assert audited["by_kind"]["too_broad"]["fitting"] == 145 and audited["by_kind"]["wrong_target"]["fitting"] == 10
    assert before["fitting"] == audited["fitting"] == 155
    assert audited["recall"] >= 0.6, audited
    # the issue-39 demo's too-broad fits are one recolouring away, so the multimodal lists find many of them too
    assert audited["by_kind"]["too_broad"]["found"] >= 1.5 * before["by_kind"]["too_broad"]["found"], (audited, before)
