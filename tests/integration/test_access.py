"""Every page but login needs a login; roles decide the rest."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

PAGES = ["/", "/datasets/", "/datasets/circo/", "/datasets/import/", "/admin/", "/api/schema/"]


@pytest.fixture
def circo(db):
    call_command("import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"))


@pytest.mark.parametrize("url", PAGES)
def test_anonymous_is_sent_to_login(client, circo, url):
    resp = client.get(url)
    assert resp.status_code in (302, 401, 403)
    if resp.status_code == 302:
        assert "/login/" in resp["Location"]


def test_login_page_is_open(client):
    resp = client.get("/login/")
    assert resp.status_code == 200 and b"Log in to CIRVal" in resp.content


def test_health_is_open(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json()["ok"] is True
    assert set(resp.json()) == {"ok", "database", "schema", "broker", "cache", "workers"}


def test_health_says_when_the_schema_lags_the_code(client, monkeypatch):
    """Code served on a database that lacks a migration answers 500s (an API pass met one after a
    pull): /healthz is 503 and names the first pending migration, until it is applied."""
    from django.db.migrations.executor import MigrationExecutor
    from django.db.migrations.loader import MigrationLoader

    from retrieval import site

    monkeypatch.setattr(site, "_SCHEMA_CURRENT", False)
    pending = MigrationLoader(None, ignore_no_migrations=True).get_migration(
        "annotation", "0026_drop_study_too_broad_threshold"
    )
    monkeypatch.setattr(MigrationExecutor, "migration_plan", lambda self, targets: [(pending, False)])
    resp = client.get("/healthz")
    assert resp.status_code == 503 and resp.json()["schema"] == {"ok": False}
    admin = get_user_model().objects.create_superuser("root", password="pw")
    client.force_login(admin)
    error = client.get("/healthz").json()["schema"]["error"]
    assert (
        error
        == "1 unapplied migration(s), first annotation.0026_drop_study_too_broad_threshold: run ./cirval setup (or manage.py migrate)"
    )
    monkeypatch.undo()
    monkeypatch.setattr(site, "_SCHEMA_CURRENT", False)
    assert client.get("/healthz").json()["schema"]["ok"] is True


def test_the_site_icon_is_served_without_a_login(client):
    """Browsers ask for /favicon.ico by themselves: the site's icon (it was a 404 on every page)."""
    resp = client.get("/favicon.ico")
    assert resp.status_code == 301 and resp["Location"].endswith("cirval/favicon.svg")
    assert 'rel="icon"' in client.get("/login/").content.decode()


def test_roles(client, demo_accounts, circo):
    client.login(username="annotator1", password=demo_accounts["annotator1"])
    assert client.get("/").status_code == 200
    assert client.get("/datasets/").status_code == 403  # corpus pages are for researchers and staff
    assert client.get("/datasets/circo/").status_code == 403
    assert client.get("/datasets/import/").status_code == 403  # staff only
    assert client.get("/admin/").status_code == 302
    client.logout()
    client.login(username="researcher", password=demo_accounts["researcher"])
    page = client.get("/datasets/circo/")
    assert page.status_code == 200 and b"220" in page.content
    client.logout()
    client.login(username="admin", password=demo_accounts["admin"])
    assert client.get("/datasets/import/").status_code == 200
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/retrieval/query/").status_code == 200


def test_missing_image_is_a_placeholder(client, demo_accounts, circo):
    from retrieval.models import Image

    client.login(username="researcher", password=demo_accounts["researcher"])
    img = Image.objects.filter(dataset__name="circo").first()
    resp = client.get(f"/images/{img.pk}/?size=160")
    assert resp.status_code == 200 and resp["Content-Type"] == "image/svg+xml"
    assert b"image missing" in resp.content
