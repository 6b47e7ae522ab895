"""The site's own pages, outside any app's namespace: the home page (the datasets) and
``/healthz`` (the database, the broker, the cache and the workers). Routed by the root
URLconf (``include("retrieval.site")``): ``config`` imports no app."""

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import path

from retrieval.models import Dataset


def home(request):
    return render(request, "home.html", {"datasets": Dataset.objects.all()[:20]})


def _check(fn) -> dict:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure of a dependency means it is down
        return {"ok": False, "error": str(exc).strip() or type(exc).__name__}


def _database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"ok": True, "vendor": connection.vendor}


_SCHEMA_CURRENT = False  # once every migration is applied, this process need not look again


def _schema() -> dict:
    """Every migration of the checkout applied to the database (code on an older schema answers
    500s): a RuntimeError naming the first pending one otherwise."""
    global _SCHEMA_CURRENT
    if not _SCHEMA_CURRENT:
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            first = plan[0][0]
            raise RuntimeError(
                f"{len(plan)} unapplied migration(s), first {first.app_label}.{first.name}: "
                "run ./cirval setup (or manage.py migrate)"
            )
        _SCHEMA_CURRENT = True
    return {"ok": True}


def _broker() -> dict:
    """Connect to the Celery broker (a short timeout: this is a health check)."""
    from celery import current_app

    with current_app.connection_for_write(connect_timeout=1) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=1)
        return {"ok": True, "transport": conn.transport_cls}


def _workers() -> dict:
    from retrieval.jobs import workers

    return workers.health()


@login_not_required
def healthz(request):
    """Each dependency (database, its schema, broker, cache, workers) with ``ok`` and, when down, why;
    200 when all are up, 503 when one is down (workers: down when work waits and no worker
    beats; the reasons are shown to staff only). ``/healthz?live=1``: 200 while this process and its database answer (for a load
    balancer: a cache or broker outage must not take the web tier out)."""
    from config.cache import cache_health

    checks = {"database": _check(_database)}
    if request.GET.get("live"):
        ok = checks["database"]["ok"]
        return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)
    checks.update(
        schema=_check(_schema) if checks["database"]["ok"] else {"ok": False, "error": "no database"},
        broker=_check(_broker),
        cache=_check(cache_health),
        workers=_check(_workers) if checks["database"]["ok"] else {"ok": False, "error": "no database"},
    )
    ok = all(c["ok"] for c in checks.values())
    if not request.user.is_staff:  # addresses, host names and errors are for staff only
        checks = {name: {k: v for k, v in c.items() if k in ("ok", "alive")} for name, c in checks.items()}
    return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)


urlpatterns = [
    path("", home, name="home"),
    path("healthz", healthz, name="healthz"),
]
