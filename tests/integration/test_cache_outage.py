"""A cache outage costs nothing (issue 29): with the cache's Redis (a real private one)
stopped, annotators keep working: throttles, image grants and cached counts fall back
to this process's memory (and the database), the outage is logged, ``/healthz`` says the
cache is down, and everything goes back to Redis when it returns."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from annotation.studies.building import StudySpec, create_study
from config.env import cache_settings
from tests.brokers import PrivateRedis, needs_redis_server
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


def _annotate(client: Client, study_id: int, n: int) -> list[int]:
    """Next item, its images, a judgement, progress: ``n`` times; every status code."""
    codes = []
    for _ in range(n):
        nxt = client.post(f"/api/studies/{study_id}/next/")
        codes.append(nxt.status_code)
        if nxt.status_code != 200 or not nxt.json().get("assignment"):
            break
        body = nxt.json()
        asg = body["assignment"]
        ref = body["query"]["turns"][0]["reference"]
        codes.append(client.get(reverse("retrieval:image", args=[ref["id"]]), {"size": 160}).status_code)
        codes.append(
            client.post(
                f"/api/assignments/{asg}/judgements/",
                {"category": "VALIDATED", "time_spent_ms": 1},
                content_type="application/json",
            ).status_code
        )
        codes.append(client.get(f"/api/studies/{study_id}/progress/").status_code)
        codes.append(client.get(f"/api/studies/{study_id}/").status_code)
    return codes


def test_annotation_keeps_working_while_the_cache_redis_is_down(tmp_path, caplog):
    needs_redis_server()
    redis = PrivateRedis(tmp_path).start()
    try:
        with override_settings(CACHES=cache_settings(redis.url, retry_seconds=0.5)):
            call_command(
                "import_dataset",
                "--format",
                "circo",
                "--name",
                "circo",
                str(FIXTURES / "datasets/circo/val.json"),
                verbosity=0,
            )
            user = get_user_model().objects.create_user("ann", password="pw-ann-1234")
            user.groups.add(Group.objects.get(name="annotator"))
            staff = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
            study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=12, annotators=["ann"]))
            c = Client()
            c.force_login(user)
            before = _annotate(c, study.pk, 2)
            assert set(before) == {200, 201}, before
            cache.set("probe", 1)
            assert cache.get("probe") == 1 and not cache.is_down  # Redis answers

            redis.stop()
            with caplog.at_level(logging.WARNING, logger="config.cache"):
                during = _annotate(c, study.pk, 4)
            assert 500 not in during and set(during) <= {200, 201}, during
            assert during.count(201) == 4  # four judgements stored while Redis was down
            assert "cache (Redis) unavailable" in caplog.text
            assert caplog.text.count("cache (Redis) unavailable") == 1  # once per outage, not per call

            s = Client()
            s.force_login(staff)
            health = s.get("/healthz")
            assert health.status_code == 503
            assert health.json()["cache"]["ok"] is False and health.json()["cache"]["fallback"] == "local memory"
            assert health.json()["database"]["ok"] is True

            redis.start()
            import time

            time.sleep(0.6)  # past retry_seconds: the next call tries Redis again
            with caplog.at_level(logging.WARNING, logger="config.cache"):
                after = _annotate(c, study.pk, 2)
            assert set(after) <= {200, 201}, after
            assert "cache (Redis) is back" in caplog.text and not cache.is_down
            assert s.get("/healthz").json()["cache"]["ok"] is True
    finally:
        redis.stop()
