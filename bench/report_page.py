"""Server time of the agreement report page on the demo world: the first view (bootstrap
computed) and later views of the unchanged study (read from the cache).

    python bench/report_page.py [--views 5] [--database-url sqlite:///var/bench/report.sqlite3]

Draws the demo world (``make_demo``, once, training the demo retrievers: minutes; reused on
later runs) into its own database, has its annotators judge every item of the validity study
(seeded random answers, through the queue), then times ``/studies/<id>/report/`` and ``report.json`` for each demo study through Django's full
request stack (test client) as staff. Prints the first view and the median of the later ones.
Target (issue 28): under 1 s for the cached view of the demo's validity study. Asserts nothing.
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
    answers = [{"category": "VALIDATED"}, {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
               {"category": "QUERY_TOO_BROAD"}]
    for user in study.annotators.order_by("username"):
        while (served := engine.next_assignment(study, user)).assignment is not None:
            answer = answers[0] if rng.random() < 0.6 else rng.choice(answers[1:])
            engine.submit(served.assignment, {**answer, "time_spent_ms": 5000})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--views", type=int, default=5, help="views per page after the first")
    ap.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'bench' / 'report.sqlite3'}"))
    args = ap.parse_args()
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
    if not Study.objects.exists():
        call_command("make_demo", stdout=StringIO())
        _judge_everything(Study.objects.get(name="demo-validity"))
    staff, _ = get_user_model().objects.get_or_create(username="bench-staff", defaults={"is_staff": True,
                                                                                       "is_superuser": True})
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
            print(f"{study.name:<24} {study.items.count():>6} items  {page:<12} status {status}  "
                  f"first {times[0]:.3f} s  cached median {statistics.median(times[1:]):.3f} s")


if __name__ == "__main__":
    main()
