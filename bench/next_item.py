"""Server time and SQL queries of "next item" and "submit judgement" on large studies.

    python bench/next_item.py [--items 10000 1000000] [--gold 50] [--annotators 30] [--overlap 3]
                              [--requests 600] [--warm-cache]
                              [--database-url postgres://postgres@127.0.0.1:5432/cirval_bench]

Builds (once per size; reused on later runs) a study of each ``--items`` size with overlap 3,
30 annotators, the default 5% gold rate and ``--gold`` gold items spread through it, in its
own PostgreSQL database, then times requests through Django's full request stack (test
client: URL routing, authentication, views, JSON) and prints, per size, the median and 95th
percentile per endpoint, the SQL queries per request (Django's count: the transaction's
BEGIN and COMMIT are not statements it sends) and the plan of the gold choice (an index
scan of ``studyitem_gold``, never a scan of the study). Each annotator gets over 20 items,
so gold falls due for all of them. Django's cache is cleared before every request (unless
``--warm-cache``), so each one costs what it costs after any cache's expiry: the printed
maximum of queries per request is that of a request on a cold process, e.g. one more than
30 s after the last (issue 30: the study's sizes are read off its row, no cache holds them).
Target: p95 under 50 ms for each endpoint and at most 10 queries per next item, at any size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pgdb import ensure_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--gold", type=int, default=50, help="gold items per study")
    ap.add_argument("--annotators", type=int, default=30)
    ap.add_argument("--overlap", type=int, default=3)
    ap.add_argument(
        "--requests",
        type=int,
        default=900,
        help="next+submit pairs to time (900: 30 per annotator, past the 20th, where gold falls due)",
    )
    ap.add_argument(
        "--warm-cache",
        action="store_true",
        help="keep Django's cache between requests (default: cleared before each one)",
    )
    ap.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cirval_bench"),
    )
    args = ap.parse_args()

    if args.database_url.startswith("postgres"):
        ensure_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    if not args.warm_cache:  # the cache cleared before each request is this process's own, never a shared Redis
        os.environ["CACHE_URL"] = os.environ["REDIS_CACHE_URL"] = ""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("CIRVAL_VAR_DIR", str(ROOT / "var" / "bench"))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    for n_items in args.items:
        study = build_study(args, n_items)
        measure(args, study)


PANEL = 20  # images in each item's stored candidate panel (as a worker leaves it: see annotation.judging.candidates)


def insert_select(model, exprs: dict[str, str], source: str, params=()) -> int:
    """``INSERT INTO <model's table> SELECT ... <source>``: one statement for any number of
    rows. ``exprs``: column -> SQL expression over ``source`` (e.g. over ``generate_series``;
    no placeholders: ``params`` are those of ``source``);
    every other column gets its field's default (the id its sequence). Returns the rows made."""
    from django.db import connection, models

    cols, select, values = [], [], []
    for f in model._meta.concrete_fields:
        if f.column not in exprs and (
            f.primary_key or getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        ):
            if not f.primary_key:
                cols.append(connection.ops.quote_name(f.column))
                select.append("now()")
            continue
        cols.append(connection.ops.quote_name(f.column))
        if f.column in exprs:
            select.append(exprs[f.column])
        else:
            default = f.get_default()
            select.append("%s")
            values.append(f.get_db_prep_save(default, connection) if not isinstance(f, models.ForeignKey) else default)
    sql = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({', '.join(cols)}) "
        f"SELECT {', '.join(select)} {source}"
    )
    with connection.cursor() as c:
        c.execute(sql, [*values, *params])
        return c.rowcount


def build_study(args, n_items: int):
    """The bench study of ``n_items`` items (made once, reused). On PostgreSQL its rows are
    written by ``INSERT ... SELECT`` over ``generate_series`` (a million items in a few
    minutes, not an hour of ORM objects); each item has one turn, one target and a stored
    candidate panel, as after a study's panels were filled."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from annotation.models import RubricVersion, Study, StudyItem
    from annotation.sizes import recount
    from retrieval.models import Dataset, Image, Query, Target, Turn

    name = f"bench-{n_items}-{args.overlap}-{args.annotators}-gold{args.gold}"
    User = get_user_model()
    study = Study.objects.filter(name=name).first()
    if study is not None:
        return study
    t0 = time.perf_counter()
    print(f"building a study of {n_items} items ...", flush=True)
    ds, _ = Dataset.objects.get_or_create(name="bench", defaults={"format": "demo"})
    for i in range(PANEL + 2):
        Image.objects.get_or_create(
            dataset=ds, external_id=f"img{i}", defaults={"missing": True, "width": 64, "height": 64}
        )
    imgs = list(Image.objects.filter(dataset=ds).order_by("id").values_list("id", flat=True))
    have = Query.objects.filter(dataset=ds).count()
    with transaction.atomic():
        if have < n_items:  # queries q<have>.. q<n_items - 1>, each with one turn and one target
            insert_select(
                Query,
                {"dataset_id": str(ds.pk), "external_id": "'q' || g", "split": "'val'", "ordinal": "g"},
                "FROM generate_series(%s, %s) AS g",
                [have, n_items - 1],
            )
            new = "FROM retrieval_query q WHERE q.dataset_id = %s AND q.ordinal >= %s"
            insert_select(
                Turn,
                {
                    "query_id": "q.id",
                    "index": "1",
                    "reference_image_id": str(imgs[0]),
                    "texts": """'[{"text": "make it red"}]'::jsonb""",
                },
                new,
                [ds.pk, have],
            )
            insert_select(
                Target, {"query_id": "q.id", "image_id": str(imgs[1]), "is_primary": "true"}, new, [ds.pk, have]
            )
        print(f"  queries, turns and targets in {time.perf_counter() - t0:.1f} s", flush=True)
        study = Study.objects.create(name=name, rubric=RubricVersion.builtin("validity"), overlap=args.overlap)
        every = max(1, n_items // max(args.gold, 1))
        gold = f"({args.gold > 0} AND (q.n - 1) %% {every} = {every // 2})"
        panel = "'" + str(imgs[2 : 2 + PANEL]) + "'::jsonb"
        insert_select(
            StudyItem,
            {
                "study_id": str(study.pk),
                "query_id": "q.id",
                "order_key": "q.n - 1",
                "gold": gold,
                "gold_answer": f"""CASE WHEN {gold} THEN '{{"validated": true}}'::jsonb ELSE '{{}}'::jsonb END""",
                "candidates": panel,
                "candidates_source": "'bench'",
            },
            "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM retrieval_query "
            "WHERE dataset_id = %s ORDER BY id LIMIT %s) q",
            [ds.pk, n_items],
        )
        recount(study)  # the items were written around the ORM (annotation/sizes.py)
    print(f"  study items in {time.perf_counter() - t0:.1f} s", flush=True)
    users = []
    for i in range(args.annotators):
        users.append(User.objects.get_or_create(username=f"bench{i:02d}")[0])  # force_login: no password
    study.annotators.set(users)
    with connection.cursor() as c:
        c.execute("ANALYZE")
    print(f"  built in {time.perf_counter() - t0:.1f} s", flush=True)
    return study


def gold_plan(study, user) -> str:
    """The plan of the gold choice query for ``user`` (its first lines)."""
    from django.db import connection

    from annotation.assignment.queue import _with_earlier
    from annotation.models import Assignment, StudyItem

    if connection.vendor != "postgresql":
        return "(plans are printed on PostgreSQL only)"
    mine = Assignment.objects.filter(study=study, annotator=user).exclude(status=Assignment.Status.RELEASED)
    qs = _with_earlier(
        StudyItem.objects.filter(study=study, gold=True).exclude(id__in=mine.values("item_id")), user
    ).order_by("order_key", "id")[:8]
    plan = qs.explain(analyze=True).splitlines()
    scans = [line.strip() for line in plan if "Scan" in line and "annotation_studyitem" in line]
    return "; ".join(scans) or plan[0]


def measure(args, study) -> None:
    import statistics

    from django.contrib.auth.models import Group
    from django.core.cache import cache
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from annotation.models import Assignment
    from annotation.roles import ANNOTATOR

    users = list(study.annotators.order_by("username"))
    Group.objects.get_or_create(name=ANNOTATOR)[0].user_set.add(*users)  # next and submit need the role
    clients = []
    for u in users:
        c = Client()
        c.force_login(u)
        clients.append(c)

    next_ms, submit_ms, next_q, submit_q = [], [], [], []
    next_cpu, submit_cpu = [], []  # this process's CPU time (the web tier's share; PostgreSQL's is not in it)
    for n in range(args.requests):
        c = clients[n % len(clients)]
        if not args.warm_cache:
            cache.clear()  # as after any cache's expiry (this process's own cache: see main)
        connection.queries_log.clear()  # the log is capped: keep it from filling up
        with CaptureQueriesContext(connection) as ctx:
            t, cpu = time.perf_counter(), time.process_time()
            r = c.post(f"/api/studies/{study.pk}/next/")
            next_ms.append((time.perf_counter() - t) * 1000)
            next_cpu.append((time.process_time() - cpu) * 1000)
        next_q.append(len(ctx.captured_queries))
        asg = r.json()["assignment"]
        if asg is None:
            break
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as ctx:
            t, cpu = time.perf_counter(), time.process_time()
            r = c.post(
                f"/api/assignments/{asg}/judgements/",
                {"category": "VALIDATED", "time_spent_ms": 900},
                content_type="application/json",
            )
            submit_ms.append((time.perf_counter() - t) * 1000)
            submit_cpu.append((time.process_time() - cpu) * 1000)
        submit_q.append(len(ctx.captured_queries))
        assert r.status_code == 201, r.content

    done = Assignment.objects.filter(study=study, status="done").count()
    gold = Assignment.objects.filter(study=study, item__gold=True).count()
    print(
        f"study: {study.items.count()} items ({study.items.filter(gold=True).count()} gold, gold rate "
        f"{study.gold_rate:.0%}), overlap {study.overlap}, {len(users)} annotators, {done} judgements so far "
        f"({gold} of them on gold items)"
    )
    print(
        f"database: {connection.vendor} ({args.database_url}); cache {'kept' if args.warm_cache else 'cleared'} "
        f"before each request"
    )
    over = sum(q > 10 for q in next_q)
    print(f"next item: at most {max(next_q)} queries per request ({over} of {len(next_q)} requests over 10)")
    for label, ms, q, cpu in (
        ("next item", next_ms, next_q, next_cpu),
        ("submit judgement", submit_ms, submit_q, submit_cpu),
    ):
        print(
            f"{label:17} n={len(ms):4d}  median {statistics.median(ms):6.1f} ms  p95 {pct(ms, 0.95):6.1f} ms  "
            f"max {max(ms):6.1f} ms  queries/request median {statistics.median(q):.0f} (max {max(q)})  "
            f"CPU median {statistics.median(cpu):.1f} ms"
        )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"gold choice plan: {gold_plan(study, users[0])}")
    print("target: p95 < 50 ms per endpoint, next item <= 10 queries")


if __name__ == "__main__":
    main()
