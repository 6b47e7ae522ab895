"""The CIRCUS agreement study imported into the database (``import_circus``) and re-analysed
through ``agreement --study``: every figure of annotations/agreement_report.json, to 1e-9.

Fixtures: tests/fixtures/circus (see its README): the 7 agreement_users files and the
published report, whose item_level_rows are the only source for annotator_03 and
annotator_08 (FORMATS.md §1.3).
"""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from annotation.agreement.reports import study_report, study_triples
from annotation.models import Assignment, Judgement, Study, StudyItem
from retrieval.models import Dataset, Query
from tests.conftest import FIXTURES
from tests.integration.test_agreement_command import check_validity_blocks

pytestmark = pytest.mark.django_db
CIRCUS = FIXTURES / "circus"
REPORT = CIRCUS / "agreement_report.json"
FILES = sorted(str(p) for p in (CIRCUS / "agreement_users").glob("annotator_*.json"))


def import_circus(*args: str) -> str:
    out = StringIO()
    call_command("import_circus", *args, stdout=out)
    return out.getvalue()


def agreement_json(study: Study) -> dict:
    out = StringIO()
    call_command(
        "agreement",
        "--study",
        str(study.pk),
        "--rubric",
        "validity",
        "--format",
        "json",
        "--constant-pairs",
        "one",
        "--bootstrap",
        "0",
        stdout=out,
        stderr=StringIO(),
    )
    return json.loads(out.getvalue())


@pytest.fixture
def published() -> dict:
    from annotation.agreement.circus_files import load_agreement_report

    return load_agreement_report(REPORT)


@pytest.fixture
def nine(db) -> Study:
    import_circus(
        "--study-name", "circus-iaa", *FILES, "--report", str(REPORT), "--from-report", "annotator_03,annotator_08"
    )
    return Study.objects.get(name="circus-iaa")


def test_all_nine_annotators_reproduced_through_the_database(nine, published) -> None:
    report = agreement_json(nine)
    raters = published["all_annotators"]
    assert report["annotators"] == sorted(raters)
    assert report["n_judgements"] == 450 and report["n_items_excluded"] == 0
    check_validity_blocks(report, published, raters)


def test_blind_users_reproduced_in_a_second_study(nine, published) -> None:
    import_circus("--study-name", "circus-blind", *FILES)
    blind = Study.objects.get(name="circus-blind")
    expected = published["blind_only_summary"]
    report = agreement_json(blind)
    assert report["annotators"] == sorted(expected["users"]) and report["n_judgements"] == 350
    check_validity_blocks(report, expected, expected["users"])
    # both studies share the placeholder datasets and queries
    assert Query.objects.filter(dataset__name__startswith="circus-").count() == 50
    assert StudyItem.objects.filter(study=blind).count() == 50


def test_database_layout(nine, published) -> None:
    summary = published["sample_summary"]
    datasets = {d.name: d for d in Dataset.objects.filter(name__startswith="circus-")}
    assert sorted(datasets) == ["circus-circo", "circus-cirr", "circus-fashioniq", "circus-lasco"]
    assert all(d.extra["circus_placeholder"] for d in datasets.values())
    items = StudyItem.objects.filter(study=nine).select_related("query__dataset")
    assert Counter(i.query.dataset.name.removeprefix("circus-") for i in items) == summary["dataset_counts"]
    assert Counter(i.hidden_category for i in items) == summary["hidden_category_counts"]
    q = Query.objects.get(dataset__name="circus-cirr", ordinal=3775)
    assert q.external_id == "3775" and q.extra == {"circus_placeholder": True} and q.turns.get().texts == []
    assert nine.status == Study.Status.CLOSED and nine.annotators.count() == 9 and nine.overlap == 9
    assert all(i.agreement and i.completed == 9 for i in items)
    user = nine.annotators.get(username="annotator_01")
    assert not user.has_usable_password() and user.groups.filter(name="annotator").exists()
    # annotator_01's second item in presentation order (see tests/unit/test_circus_report.py)
    a = Assignment.objects.get(study=nine, annotator=user, position=2)
    assert (a.item.query.dataset.name, a.item.query.ordinal, a.status) == ("circus-cirr", 3775, "done")
    j = a.revisions.get(is_current=True)
    assert j.validated is True and j.category == "VALIDATED" and j.note == ""
    assert j.created_at.isoformat() == "2026-04-24T15:40:07+00:00"


def test_invalid_unspecified_and_flags(nine, published) -> None:
    # annotator_08's single INVALID_UNSPECIFIED judgement: validated false, no flag, category ''
    unspecified = Judgement.objects.filter(assignment__study=nine, validated=False, category="")
    assert [j.assignment.annotator.username for j in unspecified] == ["annotator_08"]
    assert unspecified.get().flags == {f: False for f in unspecified.get().flags} and len(unspecified.get().flags) == 4
    triples = study_triples(nine.pk)
    assert [t for t in triples if t[2] == []] == [(unspecified.get().assignment.item_id, "annotator_08", [])]
    # several flags: the category is the most severe, every flag is kept
    multi = [j for j in Judgement.objects.filter(assignment__study=nine, validated=False) if sum(j.flags.values()) > 1]
    assert multi
    order = ["INVALID_TARGET_IMAGE", "INVALID_IMAGE_QUERY", "INVALID_TEXT_QUERY", "QUERY_TOO_BROAD"]
    for j in multi:
        assert j.category == next(f for f in order if j.flags[f])


def test_votes_per_item_match_the_report(nine, published) -> None:
    report = study_report(nine)
    rows = {(r["dataset"], r["query_idx"]): r for r in published["item_level_rows"]}
    # consensus per item from the published vote counts (majority of 9: never a tie)
    expected = Counter("validated" if r["valid_votes"] * 2 > 9 else "rejected" for r in rows.values())
    assert report["consensus"]["status"]["validated"] == expected["validated"]
    assert report["consensus"]["status"]["rejected"] == expected["rejected"]
    assert report["consensus"]["status"]["adjudication"] == 0
    # valid votes of every item, through the database
    valid = Counter()
    for item_id, _, label in study_triples(nine.pk):
        valid[item_id] += label == "VALIDATED"
    by_item = {
        i.pk: (i.query.dataset.name.removeprefix("circus-"), i.query.ordinal)
        for i in StudyItem.objects.filter(study=nine).select_related("query__dataset")
    }
    assert {by_item[i]: n for i, n in valid.items() if n} == {
        k: r["valid_votes"] for k, r in rows.items() if r["valid_votes"]
    }
    # per-dataset breakdown counts
    for ds, n in published["sample_summary"]["dataset_counts"].items():
        assert report["by_dataset"][f"circus-{ds}"]["items"] == n


def test_rerun_is_idempotent_and_edits_become_revisions(nine, tmp_path) -> None:
    before = (StudyItem.objects.count(), Assignment.objects.count(), Judgement.objects.count(), Query.objects.count())
    out = import_circus(
        "--study-name", "circus-iaa", *FILES, "--report", str(REPORT), "--from-report", "annotator_03,annotator_08"
    )
    assert "created 0 placeholder queries, 0 items, 0 users, 0 assignments, 0 judgements, 0 revisions" in out
    assert (
        StudyItem.objects.count(),
        Assignment.objects.count(),
        Judgement.objects.count(),
        Query.objects.count(),
    ) == before
    # annotator_01 re-edits an item: a second revision, the first kept
    raw = json.loads((CIRCUS / "agreement_users" / "annotator_01.json").read_text())
    entry = next(a for a in raw["assignments"] if a["assignment_id"] == "cirr::3775")
    entry["annotation"].update(validated=False, QUERY_TOO_BROAD=True, other="too many red cars")
    edited = tmp_path / "annotator_01.json"
    edited.write_text(json.dumps(raw))
    out = import_circus("--study-name", "circus-iaa", str(edited))
    assert "0 judgements, 1 revisions" in out
    revisions = Judgement.objects.filter(
        assignment__study=nine, assignment__annotator__username="annotator_01", assignment__item__query__ordinal=3775
    ).order_by("revision")
    assert [(j.revision, j.is_current, j.category, j.note) for j in revisions] == [
        (1, False, "VALIDATED", ""),
        (2, True, "QUERY_TOO_BROAD", "too many red cars"),
    ]


def test_judgements_are_stored_through_the_queues_store(db, monkeypatch) -> None:
    """import_circus writes no Judgement row itself: each goes through
    annotation.assignment.queue.store_judgement, the store of annotators' submits (the real
    one runs: the call is only counted), which marks each assignment done and counts it on its item."""
    from annotation.assignment import queue
    from annotation.studies import circus as command  # the service behind manage.py import_circus

    stored = []

    def counted(assignment, answer, client_token=""):
        j = queue.store_judgement(assignment, answer, client_token=client_token)
        stored.append(j.pk)
        return j

    monkeypatch.setattr(command, "store_judgement", counted)
    import_circus("--study-name", "through-the-store", *FILES)
    study = Study.objects.get(name="through-the-store")
    rows = Judgement.objects.filter(assignment__study=study)
    assert len(stored) == rows.count() == 350 and sorted(stored) == sorted(rows.values_list("pk", flat=True))
    assert set(rows.values_list("client_token", flat=True)) == {"circus-import"}
    assert not Assignment.objects.filter(study=study).exclude(status=Assignment.Status.DONE).exists()
    assert all(i.completed == i.taken == 7 for i in StudyItem.objects.filter(study=study))


def test_refusals(nine, tmp_path) -> None:
    with pytest.raises(CommandError, match="has a file and is also taken from the report"):
        import_circus("--study-name", "x", FILES[0], "--report", str(REPORT), "--from-report", "annotator_01")
    with pytest.raises(CommandError, match="no signatures of annotator_99"):
        import_circus("--study-name", "x", "--report", str(REPORT), "--from-report", "annotator_99")
    with pytest.raises(CommandError, match="--from-report needs --report"):
        import_circus("--study-name", "x", "--from-report", "annotator_03")
    raw = json.loads((CIRCUS / "agreement_users" / "annotator_01.json").read_text())
    raw["assignments"][0]["annotation"]["validated"] = "yes"
    bad = tmp_path / "annotator_01.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(CommandError, match=r"assignments\[0\], field 'annotation.validated'"):
        import_circus("--study-name", "x", str(bad))
    # an existing real dataset whose ordinals do not cover the items is not filled with placeholders
    Dataset.objects.create(name="real-circo", format="circo")
    with pytest.raises(CommandError, match="exists but has no query with ordinal"):
        import_circus("--study-name", "y", "--dataset-prefix", "real", *FILES)
    assert not Study.objects.filter(name__in=["x", "y"]).exists()
    # a study of that name that was not imported is left alone
    with pytest.raises(CommandError, match="was not imported from CIRCUS"):
        Study.objects.filter(pk=nine.pk).update(pool={})
        import_circus("--study-name", "circus-iaa", *FILES)


def test_reuses_a_dataset_with_matching_ordinals(db) -> None:
    import_circus("--study-name", "first", FILES[0])
    # rename the placeholder dataset as if it were a real import: its ordinals still match
    Dataset.objects.filter(name__startswith="circus-").update(extra={}, format="mbeir")
    n = Query.objects.count()
    import_circus("--study-name", "second", *FILES)
    assert Query.objects.count() == n
    assert StudyItem.objects.filter(study__name="second").count() == 50


def test_primary_export_matches_the_circus_release(nine, tmp_path) -> None:
    """The release kept annotator_03's label for its block (FORMATS.md §6): exporting the
    imported study under the primary policy with annotator_03 gives, on the 7 CIRCO items of
    the agreement study, exactly the released CIRCO allowlists and trace decisions; the
    majority policy differs only on circo::115 (5 of 9 valid votes, annotator_03 said too broad)."""
    from annotation.export.validated import export_study

    release = CIRCUS / "final_dataset"
    allow = {
        sub: set(
            json.loads((release / "query_indices" / f"circo_validated_{sub}_query_indices.json").read_text())[
                "query_indices"
            ]
        )
        for sub in ("solved", "unsolved")
    }
    kept = {}
    for sub in ("solved", "unsolved"):
        for line in (
            (release / "query_jsonl/circo" / f"validated_{sub}" / f"circo_test_validated_{sub}.trace.jsonl")
            .read_text()
            .splitlines()
        ):
            t = json.loads(line)
            kept[t["query_idx"]] = t["annotator_kept"]
    iaa_circo = {o for o in Query.objects.filter(dataset__name="circus-circo").values_list("ordinal", flat=True)}
    assert iaa_circo == {44, 55, 85, 107, 115, 157, 204}

    def exported(path, subset: str) -> dict[int, dict]:
        f = path / "circus-circo" / f"validated_{subset}" / f"circus-circo_validated_{subset}.trace.jsonl"
        return {t["query_ordinal"]: t for t in map(json.loads, f.read_text().splitlines())} if f.exists() else {}

    primary = export_study(nine, tmp_path / "primary", policy="primary", primary="annotator_03").path
    for sub in ("solved", "unsolved"):
        mine = exported(primary, sub)
        assert set(mine) == allow[sub] & iaa_circo, sub
        for idx, t in mine.items():
            assert t["consensus"]["decided_by"] == kept[idx] == "annotator_03"
    majority = export_study(nine, tmp_path / "majority").path
    assert set(exported(majority, "solved")) - set(exported(primary, "solved")) == {115}
    assert exported(majority, "unsolved").keys() == exported(primary, "unsolved").keys()
