"""Server time of the agreement report page on the demo world: the first view (bootstrap
computed) and later views of the unchanged study (read from the cache).

    python bench/report_page.py [--views 5] [--database-url sqlite:///var/bench/report.sqlite3]

Draws the demo world (``make_demo``, once, training the demo retrievers: minutes; reused on
later runs) into its own database, has its annotators judge every item of the validity study
(seeded random answers, through the queue), then times ``/studies/<id>/report/`` and ``report.json`` for each demo study through Django's full
request stack (test client) as staff. Prints the first view and the median of the later ones.
Target (issue 28): under 1 s for the cached view of the demo's validity study. Asserts nothing.

    python bench/report_page.py --items 10000 [--database-url ...]

Issue 39: the first load after a judgement on a large study. Builds (once; reused) a validity
study of ``--items`` items, each judged by 3 of 12 annotators (seeded answers, written in bulk),
but for one item left with 2; views the page (warm: the point report is cached, the intervals
are computed as the worker would, timed); then one annotator submits the last judgement through
the queue and the page is timed on its first load after it (point figures computed, intervals
said to be updating, no bootstrap in the request), the worker's computation of the new intervals
is timed in this process (``run_intervals``, what the Celery task runs), and the next view shows
them current. ``--old`` also times the old request path (the report with its bootstrap inline).
Each timed view also prints its CPU seconds in this process (SQLite runs in-process too): the
figure a machine shared with other work does not inflate, where the wall time does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _judge_everything(study) -> None:
    """Every annotator of the study judges until the queue is empty (seeded answers)."""
    import random

    from annotation.assignment import queue as engine

    rng = random.Random(0)
    answers = [
        {"category": "VALIDATED"},
        {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
        {"category": "QUERY_TOO_BROAD"},
    ]
    for user in study.annotators.order_by("username"):
        while (served := engine.next_assignment(study, user)).assignment is not None:
            answer = answers[0] if rng.random() < 0.6 else rng.choice(answers[1:])
            engine.submit(served.assignment, {**answer, "time_spent_ms": 5000})


ANNOTATORS = 12
ANSWERS = [
    {"category": "VALIDATED"},
    {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
    {"category": "QUERY_TOO_BROAD"},
]


def _circo_file(n_items: int, folder: Path) -> Path:
    """A CIRCO-format annotation file of ``n_items`` synthetic queries (ids only: no image files)."""
    import json

    path = folder / f"circo-{n_items}.json"
    if not path.exists():
        rows = [
            {
                "reference_img_id": 1_000_000 + i,
                "target_img_id": 2_000_000 + i,
                "relative_caption": f"change {i}",
                "shared_concept": "a thing",
                "gt_img_ids": [2_000_000 + i],
                "id": i,
            }
            for i in range(n_items)
        ]
        path.write_text(json.dumps(rows))
    return path


def _judgement_fields(study, users) -> list[dict]:
    """The stored fields of each answer in :data:`ANSWERS`, as the queue stores them (one real
    submit each, on the study's first item)."""
    from annotation.assignment import queue as engine
    from annotation.models import Assignment, Judgement, StudyItem

    item = StudyItem.objects.filter(study=study).order_by("id").first()
    fields = []
    for user, answer in zip(users, ANSWERS):
        a = Assignment.objects.create(study=study, item=item, annotator=user, position=1, status="reserved")
        engine.submit(a, {**answer, "time_spent_ms": 5000})
        j = Judgement.objects.get(assignment=a)
        fields.append({f: getattr(j, f) for f in ("rubric_id", "category", "sub_reason", "flags", "validated")})
    return fields


def build_large(n_items: int):
    """The synthetic validity study of ``n_items`` items (made once, reused): 3 judgements per
    item from 12 annotators, written in bulk; the last item has 2 (one slot left for the bench)."""
    import random

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import transaction
    from django.utils import timezone

    from annotation.models import Assignment, Judgement, Study, StudyItem
    from annotation.sizes import recount
    from annotation.studies.building import StudySpec, create_study

    name = f"bench-report-{n_items}"
    study = Study.objects.filter(name=name).first()
    if study is not None:
        return study
    t0 = time.perf_counter()
    call_command(
        "import_dataset",
        "--format",
        "circo",
        "--split",
        "val",
        "--name",
        name,
        str(_circo_file(n_items, ROOT / "var" / "bench")),
        verbosity=0,
    )
    User = get_user_model()
    from django.contrib.auth.models import Group

    role = Group.objects.get_or_create(name="annotator")[0]
    users = [User.objects.get_or_create(username=f"rater{i:02d}")[0] for i in range(ANNOTATORS)]
    role.user_set.add(*users)
    study, _ = create_study(
        StudySpec(name=name, datasets=[name], overlap=3, total=n_items, seed=1, annotators=[u.username for u in users])
    )
    fields = _judgement_fields(study, users)
    rng, now = random.Random(0), timezone.now()
    items = list(StudyItem.objects.filter(study=study).order_by("id").values_list("id", flat=True))
    with transaction.atomic():
        made = Assignment.objects.bulk_create(
            [
                Assignment(
                    study=study,
                    item_id=item,
                    annotator=users[(n + k) % ANNOTATORS],
                    status="done",
                    position=n + 1,
                    completed_at=now,
                )
                for n, item in enumerate(items[1:], start=1)
                for k in range(3 if n < len(items) - 1 else 2)
            ],
            batch_size=2000,
        )
        Judgement.objects.bulk_create(
            [
                Judgement(assignment=a, time_spent_ms=5000, **fields[0 if rng.random() < 0.6 else rng.choice((1, 2))])
                for a in made
            ],
            batch_size=2000,
        )
        StudyItem.objects.filter(study=study).exclude(pk=items[-1]).update(taken=3, completed=3)
        StudyItem.objects.filter(pk=items[-1]).update(taken=2, completed=2)
        recount(study)
    print(
        f"built {name}: {len(items)} items, {Judgement.objects.filter(assignment__study=study).count()} judgements "
        f"in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return study


_cpu: list[float] = [0.0]  # CPU seconds of the last timed view (this process): the load-independent figure


def _timed_get(client, url: str) -> tuple[float, str]:
    started, cpu = time.perf_counter(), time.process_time()
    body = client.get(url).content.decode()
    _cpu[0] = time.process_time() - cpu
    return time.perf_counter() - started, body


def measure_first_load(client, study, old: bool) -> None:
    """Issue 39: the page's first load after a judgement (module docstring)."""
    from annotation.agreement.intervals import interval_options, run_intervals
    from annotation.agreement.reports import default_bootstrap, study_report
    from annotation.assignment import queue as engine
    from annotation.models import Assignment, StudyItem

    url = f"/studies/{study.pk}/report/"
    options = interval_options(study)
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    seconds, _ = _timed_get(client, url)
    print(
        f"{study.name}: {study.n_items} items, {default_bootstrap(study)} replicates; a view before: {seconds:.3f} s "
        f"(CPU {_cpu[0]:.3f} s)"
    )
    started = time.perf_counter()
    print(
        f"  the worker's intervals (run_intervals, in this process): {run_intervals(study.pk, options)} "
        f"in {time.perf_counter() - started:.2f} s"
    )
    item = StudyItem.objects.filter(study=study).order_by("-id").first()
    judged = set(Assignment.objects.filter(item=item).values_list("annotator_id", flat=True))
    user = next(u for u in study.annotators.order_by("username") if u.pk not in judged)
    a = Assignment.objects.create(study=study, item=item, annotator=user, position=10**6, status="reserved")
    engine.submit(a, {**ANSWERS[1], "time_spent_ms": 5000})
    seconds, body = _timed_get(client, url)
    updating = 'id="intervals-updating"' in body
    print(
        f"  FIRST LOAD AFTER A JUDGEMENT: {seconds:.3f} s (CPU {_cpu[0]:.3f} s; target < 1 s); "
        f"intervals said to be updating: {updating}"
    )
    started = time.perf_counter()
    print(f"  the worker's new intervals: {run_intervals(study.pk, options)} in {time.perf_counter() - started:.2f} s")
    seconds, body = _timed_get(client, url)
    print(
        f"  the next view: {seconds:.3f} s, intervals current: {'intervals-updating' not in body and 'Brackets:' in body}"
    )
    if old:
        started = time.perf_counter()
        study_report(study, n_boot=options["n_boot"], seed=0)
        print(
            f"  the old request path (report with its bootstrap inline, no page rendering): "
            f"{time.perf_counter() - started:.2f} s"
        )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--views", type=int, default=5, help="views per page after the first")
    ap.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL"),
        help="default: var/bench/report.sqlite3, or report-<items>.sqlite3 with --items",
    )
    ap.add_argument(
        "--items",
        type=int,
        default=0,
        help="time the first load after a judgement on a synthetic study of this many items",
    )
    ap.add_argument("--old", action="store_true", help="with --items: also time the old request path")
    args = ap.parse_args()
    args.database_url = (
        args.database_url
        or f"sqlite:///{ROOT / 'var' / 'bench' / (f'report-{args.items}.sqlite3' if args.items else 'report.sqlite3')}"
    )
    sys.path.insert(0, str(ROOT / "bench"))
    from pgdb import setup_django

    setup_django(args.database_url, ROOT)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from annotation.models import Study

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    staff, _ = get_user_model().objects.get_or_create(
        username="bench-staff", defaults={"is_staff": True, "is_superuser": True}
    )
    if args.items:
        client = Client()
        client.force_login(staff)
        measure_first_load(client, build_large(args.items), args.old)
        return
    if not Study.objects.exists():
        call_command("make_demo", stdout=StringIO())
        _judge_everything(Study.objects.get(name="demo-validity"))
    client = Client()
    client.force_login(staff)
    for study in Study.objects.order_by("pk"):
        for page in ("report/", "report.json"):
            url = f"/studies/{study.pk}/{page}"
            times = []
            for _ in range(1 + args.views):
                started = time.perf_counter()
                status = client.get(url).status_code
                times.append(time.perf_counter() - started)
            print(
                f"{study.name:<24} {study.n_items:>6} items  {page:<12} status {status}  "
                f"first {times[0]:.3f} s  cached median {statistics.median(times[1:]):.3f} s"
            )


if __name__ == "__main__":
    main()
