"""Issue 25, item 4: reliability-weighted consensus on a study of a careful annotator (always
right), a fair one (wrong on every fifth item) and a weak one (wrong on every third): where the
fair and the weak one err together the majority is wrong; Dawid-Skene learns who is reliable
and follows the careful annotator there. The export's trace lines and its manifest show the
majority verdict wherever the two differ."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from annotation.export.validated import export_study
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.readmodel import study_reliability
from annotation.verdicts.state import study_counts
from tests.conftest import FIXTURES, make_annotator
from tests.integration.test_report_export import judge

pytestmark = pytest.mark.django_db
N = 60


@pytest.fixture
def study():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    users = [make_annotator(n) for n in ("careful", "fair", "weak")]
    study, _ = create_study(
        StudySpec(
            name="weighted",
            datasets=["circo"],
            overlap=3,
            total=N,
            seed=2,
            annotators=[u.username for u in users],
            consensus="reliability",
            candidates=0,
        )
    )
    for n, item in enumerate(StudyItem.objects.filter(study=study).order_by("order_key")):
        valid = n % 4 != 0
        judge(study, item, users[0], "V" if valid else "TEXT")  # always right
        judge(study, item, users[1], "V" if valid != (n % 5 == 1) else "TEXT")  # wrong on every fifth
        judge(study, item, users[2], "V" if valid != (n % 3 == 0) else "TEXT")  # wrong on every third
    return Study.objects.get(pk=study.pk)


def test_reliability_outweighs_an_erring_pair_and_shows_the_majority(study, tmp_path):
    rel = study_reliability(study)
    table = rel.by_annotator
    assert table["careful"].accuracy > table["fair"].accuracy > table["weak"].accuracy
    assert table["careful"].low > table["weak"].high  # the intervals tell them apart
    # where the fair and the weak annotator err together (n % 15 == 6) the majority is wrong
    order = list(StudyItem.objects.filter(study=study).order_by("order_key"))
    both_wrong = {item.pk: n % 4 != 0 for n, item in enumerate(order) if n % 15 == 6}
    assert {d["item"] for d in rel.differs} == set(both_wrong)
    for d in rel.differs:
        truly = "validated" if both_wrong[d["item"]] else "rejected"
        assert d["reliability"] == truly and d["majority"] != truly
    expected = {i for i, valid in both_wrong.items() if valid}  # validated only by the weighted consensus

    counts = study_counts(study)  # the study's own consensus: reliability-weighted, right on every item
    splits = sum(1 for n in range(N) if n % 5 == 1 or n % 3 == 0)  # 2-1 votes, decided by the model
    assert counts["status"]["validated"] == 45 and counts["provenance"]["reliability"] == splits
    assert counts["provenance"]["unanimous"] == N - splits

    result = export_study(study, tmp_path / "out", policy="reliability")
    block = result.manifest["consensus"]["reliability"]
    assert block["differs_from_majority"] == len(both_wrong)
    assert {d["item"] for d in block["differing_items"]} == set(both_wrong)
    trace = {
        json.loads(line)["item"]: json.loads(line)
        for f in (tmp_path / "out").rglob("*.trace.jsonl")
        for line in f.read_text().splitlines()
    }
    assert len(trace) == 45
    for item, line in trace.items():
        if item in expected:
            assert line["majority"]["majority"] == "rejected" and line["consensus"]["provenance"] == "reliability"
        else:
            assert "majority" not in line
    majority = export_study(study, tmp_path / "maj", policy="majority").manifest["counts"]
    assert majority["validated"] == 45 - len(expected) + (len(both_wrong) - len(expected))
