"""Error pages, Content-Security-Policy, login and API throttling, image access."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from annotation.access import may_fetch_image
from annotation.assignment import queue as engine
from annotation.studies.building import StudySpec, create_study
from retrieval.access import image_access
from retrieval.models import Image
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings):
    cache.clear()
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    User = get_user_model()
    a = User.objects.create_user("ann", password="pw-ann-1234")
    b = User.objects.create_user("bob", password="pw-bob-1234")
    for u in (a, b):
        u.groups.add(Group.objects.get(name="annotator"))
    study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=4, annotators=["ann"]))
    create_study(StudySpec(name="t", datasets=["circo"], overlap=1, total=4, seed=1, annotators=["bob"]))
    return {"ann": a, "bob": b, "study": study}


@pytest.mark.parametrize("debug", [True, False])
def test_404_pages_are_the_sites_own_and_never_list_urls(world, settings, debug):
    settings.DEBUG = debug
    c = Client()
    c.force_login(world["ann"])
    for url, words in [
        ("/no/such/page/", "no page at this address"),
        (reverse("annotation:history", args=[world["study"].pk + 100]), "no such study"),
    ]:
        resp = c.get(url)
        body = resp.content.decode()
        assert resp.status_code == 404
        assert 'id="error-page"' in body and words in body.lower()
        assert "URLconf" not in body and "urlpatterns" not in body and "Using the URLconf" not in body


def test_403_page_explains_itself(world, settings):
    settings.DEBUG = True
    c = Client()
    c.force_login(world["ann"])
    resp = c.get(reverse("room:users"))
    body = resp.content.decode()
    assert resp.status_code == 403 and 'id="error-page"' in body and "Only staff may do this." in body
    assert "ask the project's admin" in body


def test_csp_header_and_no_inline_script_on_the_item_page(world):
    c = Client()
    c.force_login(world["ann"])
    served = engine.next_assignment(world["study"], world["ann"]).assignment
    resp = c.get(reverse("annotation:item", args=[world["study"].pk, served.pk]))
    assert resp.status_code == 200
    csp = resp["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    html = resp.content.decode()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, tag
    assert not re.search(r"\son[a-z]+=", html)


def test_login_is_throttled_per_account_and_address(world, settings):
    """Locked per (account, address): the owner still gets in from elsewhere, another
    account's login resets nothing, guesses from another address do not extend the lock, the
    page says for how long, and staff unlock it on the users page."""
    from axes.models import AccessAttempt

    settings.AXES_FAILURE_LIMIT = 3
    c = Client(REMOTE_ADDR="10.0.0.1")
    for _ in range(3):
        c.post("/login/", {"username": "ann", "password": "wrong"})
    locked = c.post("/login/", {"username": "ann", "password": "pw-ann-1234"})
    assert locked.status_code == 429 and "_auth_user_id" not in c.session
    assert "Try again in 15 minutes" in " ".join(locked.content.decode().split())
    # a valid login to another account from the same address neither is refused nor resets ann's lock
    assert (
        Client(REMOTE_ADDR="10.0.0.1").post("/login/", {"username": "bob", "password": "pw-bob-1234"}).status_code
        == 302
    )
    assert (
        Client(REMOTE_ADDR="10.0.0.1").post("/login/", {"username": "ann", "password": "pw-ann-1234"}).status_code
        == 429
    )
    # an attacker elsewhere neither locks the owner out nor extends the lock at 10.0.0.1
    stamp = AccessAttempt.objects.get(username="ann", ip_address="10.0.0.1").attempt_time
    attacker = Client(REMOTE_ADDR="10.0.0.9")
    for _ in range(5):
        attacker.post("/login/", {"username": "ann", "password": "wrong"})
    assert AccessAttempt.objects.get(username="ann", ip_address="10.0.0.1").attempt_time == stamp
    owner = Client(REMOTE_ADDR="10.0.0.2")
    assert owner.post("/login/", {"username": "ann", "password": "pw-ann-1234"}).status_code == 302
    # staff see the lock on the users page and lift it
    boss = Client()
    boss.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    page = boss.get(reverse("room:users")).content.decode()
    row = page.split('id="user-ann"')[1].split("</tr>")[0]
    assert "locked out" in row and 'name="unlock"' in row
    boss.post(reverse("room:user_update", args=[world["ann"].pk]), {"unlock": "1"})
    assert (
        "locked out" not in boss.get(reverse("room:users")).content.decode().split('id="user-ann"')[1].split("</tr>")[0]
    )
    assert (
        Client(REMOTE_ADDR="10.0.0.1").post("/login/", {"username": "ann", "password": "pw-ann-1234"}).status_code
        == 302
    )


def test_a_256_character_login_name_is_a_form_error_not_a_500(world):
    resp = Client(REMOTE_ADDR="10.0.0.5").post("/login/", {"username": "u" * 256, "password": "wrong"})
    assert resp.status_code == 200 and "did not match" in resp.content.decode()


def test_api_is_throttled_per_account(world, monkeypatch):
    from rest_framework.throttling import UserRateThrottle

    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "3/min", "anon": "3/min"})
    c = Client()
    c.force_login(world["ann"])
    codes = [c.get(reverse("annotation:api_studies")).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]


def test_annotators_fetch_only_images_they_were_shown(world):
    # the corpus app's hook holds the annotation app's rule from app ready on (no setting names it)
    assert image_access() is may_fetch_image
    ann, bob, study = world["ann"], world["bob"], world["study"]
    served = engine.next_assignment(study, ann).assignment
    mine = served.item.query.turns.first().reference_image
    shown = {t.reference_image_id for t in served.item.query.turns.all()} | {
        t.image_id for t in served.item.query.targets.all()
    }
    other = Image.objects.exclude(pk__in=shown).first()
    c = Client()
    c.force_login(ann)
    assert c.get(reverse("retrieval:image", args=[mine.pk]), {"size": 160}).status_code == 200
    assert c.get(reverse("retrieval:image", args=[other.pk]), {"size": 160}).status_code == 404
    b = Client()
    b.force_login(bob)
    assert b.get(reverse("retrieval:image", args=[mine.pk]), {"size": 160}).status_code == 404
    # the prefetch of the next item grants exactly the images it names
    upcoming = c.get(reverse("annotation:upcoming", args=[study.pk])).json()["images"]
    for url in upcoming:
        assert c.get(url).status_code == 200


def test_api_throttle_is_atomic_under_16_threads_on_a_real_redis(world, settings, tmp_path, monkeypatch):
    """16 threads, 400 requests of one account against 100 a day on a real Redis: exactly 100
    are let through (DRF's read-append-write list let 1,836 of 2,000 through against 600)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.test import RequestFactory
    from rest_framework.request import Request
    from rest_framework.throttling import UserRateThrottle as DRFUserRateThrottle

    from config.env import cache_settings
    from config.throttling import UserRateThrottle
    from tests.brokers import PrivateRedis, needs_redis_server

    needs_redis_server()
    redis = PrivateRedis(tmp_path).start()
    try:
        settings.CACHES = cache_settings(redis.url)
        monkeypatch.setattr(DRFUserRateThrottle, "THROTTLE_RATES", {"user": "100/day", "anon": "100/day"})

        def hit(_n: int) -> bool:
            request = Request(RequestFactory().get("/api/studies/"))
            request.user = world["ann"]
            return UserRateThrottle().allow_request(request, None)

        with ThreadPoolExecutor(16) as pool:
            allowed = list(pool.map(hit, range(400)))
        assert sum(allowed) == 100
        throttle = UserRateThrottle()
        request = Request(RequestFactory().get("/api/studies/"))
        request.user = world["ann"]
        assert not throttle.allow_request(request, None) and 0 < throttle.wait() <= 86400
    finally:
        redis.stop()
