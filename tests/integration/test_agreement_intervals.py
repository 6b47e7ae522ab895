"""The agreement report's bootstrap intervals come from a worker (issue 39, item 4): the page
answers with its point figures at once and says the intervals are being updated; a real worker
computes them; a new judgement makes them stale, and stale intervals are never shown."""

from __future__ import annotations

import json

import pytest

from annotation.agreement.intervals import compute_intervals, interval_options, stored
from annotation.agreement.reports import default_bootstrap, study_agreement
from annotation.models import Judgement
from tests.conftest import wait_for
from tests.integration.test_report_export import build_twelve, judge, make_user


def _report(client, study) -> dict:
    return json.loads(client.get(f"/studies/{study.pk}/report.json").content)["agreement"]


def _expected(study) -> dict:
    return study_agreement(study, n_boot=default_bootstrap(study), seed=0)["confidence_intervals"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_page_shows_point_figures_then_current_intervals(client, worker_factory) -> None:
    study, items = build_twelve()
    client.force_login(make_user("boss", None, staff=True))
    # no worker yet: the point figures at once, the intervals said to be updating, none shown
    page = client.get(f"/studies/{study.pk}/report/").content.decode()
    assert 'id="intervals-updating"' in page and "Intervals being updated" in page
    assert 'class="muted ci"' not in page  # no bracket beside any figure
    first = _report(client, study)
    assert first["intervals_state"] == {"state": "updating"}
    assert first["confidence_intervals"]["intervals"] == {} and first["confidence_intervals"]["n_boot"] == 1000
    assert first["krippendorff_alpha"] == pytest.approx(study_agreement(study)["krippendorff_alpha"], abs=1e-12)
    assert not any(k.startswith("confidence_intervals.") for k in first["undefined"])

    worker = worker_factory(queues="celery").start("intervals")
    wait_for(
        lambda: _report(client, study)["intervals_state"]["state"] == "current",
        timeout=180,
        what=f"the worker to compute the intervals\n{worker.log()}",
    )
    current = _report(client, study)
    assert current["confidence_intervals"] == _expected(study)  # the figures of `agreement --study`
    assert "annotation.agreement_intervals" in worker.log()
    page = client.get(f"/studies/{study.pk}/report/").content.decode()
    assert 'id="intervals-updating"' not in page and "Brackets: 95% percentile bootstrap intervals" in page
    assert 'class="muted ci"' in page

    # a new judgement: the stored intervals are stale, never shown as current, until a worker ran again
    # (this one is stopped first: a delayed task of the earlier submits could otherwise run at once)
    worker.stop()
    n = Judgement.objects.count()
    judge(study, items[6], study.annotators.get(username="ann_z"), "TEXT")
    assert Judgement.objects.count() == n + 1
    stale = _report(client, study)
    assert stale["intervals_state"] == {"state": "updating"} and stale["confidence_intervals"]["intervals"] == {}
    assert 'id="intervals-updating"' in client.get(f"/studies/{study.pk}/report/").content.decode()
    worker = worker_factory(queues="celery").start("intervals-again")
    wait_for(
        lambda: _report(client, study)["intervals_state"]["state"] == "current",
        timeout=180,
        what=f"the worker to compute the intervals again\n{worker.log()}",
    )
    again = _report(client, study)
    assert again["confidence_intervals"] == _expected(study) != current["confidence_intervals"]


@pytest.mark.django_db
def test_a_stored_block_is_shown_only_for_its_fingerprint(client) -> None:
    """Without a worker: a block computed for the study as it was is not shown once a judgement
    came (the report says the intervals are being updated), and bootstrap=0 says there are none."""
    study, items = build_twelve()
    client.force_login(make_user("boss", None, staff=True))
    options = interval_options(study)
    block = compute_intervals(study, options)
    assert stored(study, options) == block
    assert _report(client, study)["confidence_intervals"] == block["confidence_intervals"]
    judge(study, items[6], study.annotators.get(username="ann_z"), "TEXT")
    after = _report(client, study)
    assert after["intervals_state"]["state"] == "updating" and after["confidence_intervals"]["intervals"] == {}
    off = json.loads(client.get(f"/studies/{study.pk}/report.json?bootstrap=0").content)["agreement"]
    assert off["intervals_state"] == {"state": "off"} and off["confidence_intervals"]["n_boot"] == 0
    csv_text = b"".join(client.get(f"/studies/{study.pk}/report.csv").streaming_content).decode()
    assert "agreement,confidence_intervals,state,updating" in csv_text
    assert "agreement,confidence_intervals,krippendorff_alpha.low" not in csv_text  # no stale interval
    assert (
        "No bootstrap intervals (bootstrap = 0)"
        in client.get(f"/studies/{study.pk}/report/?bootstrap=0").content.decode()
    )
