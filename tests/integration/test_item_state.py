"""Issue 28, item 1: one item state. Every count of one study, read from every page and API
that shows it (progress page and API, study list, report page and report.json, the export
manifest, quality signals, My studies, the end page, the item page's bar, the annotator's
progress API), equals :func:`annotation.verdicts.state.study_counts` /
:func:`~annotation.verdicts.state.annotator_share`; and the twins the issue measured."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from annotation.assignment import queue as engine
from annotation.export.validated import export_study
from annotation.models import Assignment, Judgement, StudyItem
from annotation.quality.annotator_report import quality_signals
from annotation.quality.gold import gold_scores, mark_gold, promote_unanimous
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.adjudication import adjudicate
from annotation.verdicts.state import annotator_share, study_counts
from tests.conftest import FIXTURES, make_annotator
from tests.integration.test_report_export import make_user

pytestmark = pytest.mark.django_db

VALID = {"category": "VALIDATED", "time_spent_ms": 4000}
INVALID = {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 4000}


def _study(name: str, overlap: int, total: int, annotators: list[str]):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    users = [make_annotator(n) for n in annotators]
    study, _ = create_study(
        StudySpec(name=name, datasets=["circo"], overlap=overlap, total=total, seed=5, annotators=annotators)
    )
    return study, users


def _expire(a: Assignment) -> None:
    Assignment.objects.filter(pk=a.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))


def _judge_next(study, user, payload) -> Assignment | None:
    served = engine.next_assignment(study, user)
    if served.assignment is not None:
        engine.submit(served.assignment, payload)
    return served.assignment


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _dd(html: str, id_: str) -> int:
    m = re.search(rf'id="{id_}">(\d+)<', html)
    assert m, id_
    return int(m.group(1))


def _share_text(html: str) -> tuple[int, int]:
    m = re.search(r'class="share"><b>(\d+)</b> of (\d+)', html) or re.search(r'class="share">(\d+) of (\d+)', html)
    assert m, html[:2000]
    return int(m.group(1)), int(m.group(2))


def test_every_page_and_api_reads_the_same_counts(tmp_path):
    study, (a, b, c) = _study("one-state", overlap=2, total=8, annotators=["a", "b", "c"])
    # a holds an item, lets the lease run out; b and c fill its two slots; a submits late
    held = engine.next_assignment(study, a).assignment
    _expire(held)
    while True:
        got_b = engine.next_assignment(study, b).assignment
        if got_b.item_id == held.item_id:
            break
        engine.submit(got_b, VALID)
    engine.submit(got_b, VALID)
    got_c = engine.next_assignment(study, c).assignment
    assert got_c.item_id == held.item_id  # closest to its overlap
    engine.submit(got_c, INVALID)  # 1 valid / 1 invalid: a tie, waiting for adjudication
    late = _client(a).post(f"/api/assignments/{held.pk}/judgements/", VALID, content_type="application/json")
    assert late.status_code == 201 and late.json()["late"] is True
    # a few more judgements: some items decided, one pending, the rest unjudged
    for user, payload in ((a, VALID), (c, VALID), (a, INVALID)):
        _judge_next(study, user, payload)
    staff = make_user("boss", None, staff=True)
    decided = [i for i in StudyItem.objects.filter(study=study) if i.completed == 2]
    adjudicate(study, decided[0], False, "no", staff)

    counts = study_counts(study)
    assert counts["late"] == 1 and counts["pending"] >= 1 and counts["unjudged"] >= 1
    assert counts["judgements"] == Judgement.objects.counted().filter(assignment__study=study).count()
    assert counts["judgements"] == Judgement.objects.filter(assignment__study=study, is_current=True).count() - 1
    assert sum(counts["states"].values()) == counts["items"] == 8
    assert (
        counts["pending"]
        + counts["unjudged"]
        + counts["status"]["validated"]
        + counts["status"]["rejected"]
        + counts["status"]["adjudication"]
        == counts["items"]
    )

    boss = _client(staff)
    page = boss.get(f"/studies/{study.pk}/progress/").content.decode()
    assert (
        _dd(page, "count-items"),
        _dd(page, "count-judgements"),
        _dd(page, "count-late"),
        _dd(page, "count-pending"),
        _dd(page, "count-unjudged"),
    ) == (counts["items"], counts["judgements"], counts["late"], counts["pending"], counts["unjudged"])
    for id_, value in (
        ("count-validated", counts["status"]["validated"]),
        ("count-rejected", counts["status"]["rejected"]),
        ("count-adjudicated", counts["provenance"]["adjudicated"]),
        ("count-awaiting", counts["status"]["adjudication"]),
    ):
        assert re.search(rf'id="{id_}">{value}<', page), id_
    api = boss.get(f"/api/studies/{study.pk}/progress/").json()
    assert (api["items"], api["judgements"], api["late"], api["pending"], api["unjudged"], api["items_complete"]) == (
        counts["items"],
        counts["judgements"],
        counts["late"],
        counts["pending"],
        counts["unjudged"],
        counts["complete"],
    )
    assert {r["annotator"]: (r["judged"], r["late"]) for r in api["annotators"]} == {
        u: (v["judged"], v["late"]) for u, v in counts["annotators"].items()
    }
    listing = boss.get("/studies/").content.decode()
    assert f'<td class="num">{counts["complete"]}</td><td class="num">{counts["judgements"]}</td>' in listing

    report = json.loads(boss.get(f"/studies/{study.pk}/report.json").content)
    assert (report["study"]["judgements"], report["study"]["late"], report["study"]["items"]) == (
        counts["judgements"],
        counts["late"],
        counts["items"],
    )
    assert report["consensus"]["status"] == counts["status"]
    assert report["consensus"]["provenance"] == counts["provenance"]
    assert report["consensus"]["states"] == counts["states"]
    assert f"{counts['pending']} pending" in boss.get(f"/studies/{study.pk}/report/").content.decode()

    manifest = export_study(study, tmp_path / "e").manifest["counts"]
    assert (
        manifest["items"],
        manifest["pending"],
        manifest["unjudged"],
        manifest["validated"],
        manifest["rejected"],
        manifest["adjudicated"],
        manifest["awaiting_adjudication"],
    ) == (
        counts["items"],
        counts["pending"],
        counts["unjudged"],
        counts["status"]["validated"],
        counts["status"]["rejected"],
        counts["provenance"]["adjudicated"],
        counts["status"]["adjudication"],
    )
    quality = quality_signals(study, fresh=True)
    assert {u: q["n"] for u, q in quality.items()} == {
        u: v["judged"] for u, v in counts["annotators"].items() if v["judged"]
    }

    # each annotator's share, wherever it is shown
    for user in (a, b, c):
        share = annotator_share(study, user)
        me = _client(user)
        assert me.get(f"/api/studies/{study.pk}/progress/").json() == share
        assert me.get(f"/api/studies/{study.pk}/").json()["progress"] == share
        assert _share_text(me.get("/annotate/").content.decode()) == (share["done"], share["total"])
        row = next(r for r in api["annotators"] if r["annotator"] == user.username)
        assert (row["done"], row["total"], row["remaining"]) == (share["done"], share["total"], share["remaining"])


def test_the_end_of_a_share_reads_the_same_on_the_bar_the_end_page_and_my_studies():
    """The issue's "27 of 32" / "28 of 28 judged" / "28 of 32 done" with a Continue button."""
    study, (a, b, c) = _study("end-of-share", overlap=1, total=8, annotators=["a", "b", "c"])
    me = _client(a)
    bars = []
    while True:
        r = me.post(f"/api/studies/{study.pk}/next/").json()
        if r["assignment"] is None:
            break
        bars.append((r["progress"]["done"], r["progress"]["total"]))
        item_page = me.get(f"/annotate/{study.pk}/item/{r['assignment']}/").content.decode()
        assert f'id="progress-text"><b>{bars[-1][0]}</b> of {bars[-1][1]}<' in item_page  # the item page's bar
        assert (
            me.post(
                f"/api/assignments/{r['assignment']}/judgements/", VALID, content_type="application/json"
            ).status_code
            == 201
        )
    done = len(bars)
    assert done == 8  # a alone took every item
    assert bars[-1] == (done - 1, done)  # the last item's bar: "7 of 8", not "7 of 3"
    end = me.post(f"/annotate/{study.pk}/", follow=True).content.decode()
    assert "All done" in end and _share_text(end) == (done, done)
    mine = me.get("/annotate/").content.decode()
    assert _share_text(mine) == (done, done)
    assert f'id="share-done-{study.pk}"' in mine and "Continue" not in mine
    # the others: nothing is left for them either, and nothing is promised
    for other in (b, c):
        assert annotator_share(study, other) == {"done": 0, "reserved": 0, "total": 0, "remaining": 0}


def test_a_submit_on_a_skipped_item_after_someone_else_judged_it_is_late():
    """Overlap 1: a skips, b judges, a submits on the skipped assignment: stored, late, not counted."""
    study, (a, b) = _study("skip-late", overlap=1, total=3, annotators=["a", "b"])
    first = engine.next_assignment(study, a).assignment
    engine.skip(first)
    while (got := engine.next_assignment(study, b).assignment).item_id != first.item_id:
        engine.submit(got, VALID)
    engine.submit(got, VALID)
    r = _client(a).post(f"/api/assignments/{first.pk}/judgements/", VALID, content_type="application/json")
    assert r.status_code == 201 and r.json()["late"] is True
    item = StudyItem.objects.get(pk=first.item_id)
    assert item.completed == 1 and item.taken == 1
    assert Judgement.objects.filter(assignment__item=item).count() == 2
    assert Judgement.objects.counted().filter(assignment__item=item).count() == 1
    assert study_counts(study)["late"] == 1
    # a skip whose slot is still free counts normally
    second = engine.next_assignment(study, a).assignment
    engine.skip(second)
    r = _client(a).post(f"/api/assignments/{second.pk}/judgements/", VALID, content_type="application/json")
    assert r.status_code == 201 and r.json()["late"] is False
    assert StudyItem.objects.get(pk=second.item_id).completed == 1


def test_gold_accuracy_leaves_out_the_annotators_who_made_the_gold():
    study, (a, b, c) = _study("gold-makers", overlap=2, total=4, annotators=["a", "b", "c"])
    for _ in range(2):
        _judge_next(study, a, VALID)
        _judge_next(study, b, VALID)
    assert promote_unanimous(study, 2) == 2
    gold = list(StudyItem.objects.filter(study=study, gold=True))
    assert all(g.gold_answer == {"validated": True, "made_by": ["a", "b"]} for g in gold)
    # c judges a gold item (gold items are served at the gold rate; here directly)
    a_gold = Assignment.objects.create(study=study, item=gold[0], annotator=c, status=Assignment.Status.RESERVED)
    engine.submit(a_gold, INVALID)
    scores = gold_scores(study)
    assert set(scores) == {"c"} and scores["c"]["right"] == 0 and scores["c"]["n"] == 1
    # gold by hand: every annotator is scored
    mark_gold(gold[1], True)
    assert set(gold_scores(study)) == {"a", "b", "c"}


def test_the_report_is_cached_until_the_study_changes(django_assert_max_num_queries):
    """The report page resampled 1000 bootstrap replicates on every view (7.7 s for 68 items):
    now a view of an unchanged study reads the cached report; any judgement makes a new one."""
    study, (a, b, c) = _study("cached-report", overlap=2, total=4, annotators=["a", "b", "c"])
    for user in (a, b, a, b):
        _judge_next(study, user, VALID)
    boss = _client(make_user("boss", None, staff=True))
    first = json.loads(boss.get(f"/studies/{study.pk}/report.json").content)
    assert first["agreement"]["confidence_intervals"]["n_boot"] == 1000
    with django_assert_max_num_queries(14):  # session, user, study, the version's aggregates, the cache hit
        again = json.loads(boss.get(f"/studies/{study.pk}/report.json").content)
    assert again == first
    assert boss.get(f"/studies/{study.pk}/report/").status_code == 200
    _judge_next(study, c, INVALID)
    fresh = json.loads(boss.get(f"/studies/{study.pk}/report.json").content)
    assert fresh["study"]["judgements"] == first["study"]["judgements"] + 1
