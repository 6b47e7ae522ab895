"""Settings come from the environment with working defaults: read by a fresh process, as a
server or worker reads them at its start (moved from tests/unit/test_settings.py: unit tests
start no processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def settings_in_subprocess(env: dict) -> dict:
    code = (
        "import json, django; from django.conf import settings; django.setup();"
        "d = settings.DATABASES['default'];"
        "print(json.dumps({'engine': d['ENGINE'], 'name': str(d['NAME']), 'host': d.get('HOST'),"
        " 'broker': settings.CELERY_BROKER_URL, 'roots': [str(r) for r in settings.IMAGE_ROOTS],"
        " 'var': str(settings.VAR_DIR), 'opts': settings.CELERY_BROKER_TRANSPORT_OPTIONS,"
        " 'cookies': [settings.SESSION_COOKIE_SECURE, settings.SESSION_COOKIE_HTTPONLY, settings.CSRF_COOKIE_SECURE,"
        "             settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS, settings.DEBUG]}))"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "IMAGE_ROOTS")}
    clean.update(env, DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_defaults_need_no_server(tmp_path):
    s = settings_in_subprocess({"CIRVAL_VAR_DIR": str(tmp_path)})
    assert s["engine"] == "django.db.backends.sqlite3"
    assert s["name"] == str(tmp_path / "cirval.sqlite3")
    assert s["broker"] == "filesystem://"
    assert s["opts"]["data_folder_in"] == str(tmp_path / "broker" / "queue")
    assert s["roots"] == [str(tmp_path / "images")]


def test_urls_switch_to_postgres_and_redis(tmp_path):
    s = settings_in_subprocess(
        {
            "CIRVAL_VAR_DIR": str(tmp_path),
            "DATABASE_URL": "postgres://u:p@db.example:5433/cirval",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/3",
            "IMAGE_ROOTS": f"{tmp_path}/a{os.pathsep}{tmp_path}/b",
        }
    )
    assert s["engine"] == "django.db.backends.postgresql" and s["name"] == "cirval" and s["host"] == "db.example"
    assert s["broker"] == "redis://127.0.0.1:6379/3"
    assert 0 < s["opts"]["visibility_timeout"] <= 6 * 3600  # redelivery within hours, never a day
    assert s["roots"] == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_https_makes_cookies_secure(tmp_path):
    plain = settings_in_subprocess({"CIRVAL_VAR_DIR": str(tmp_path)})
    assert plain["cookies"][:3] == [False, True, False]  # HttpOnly always, Secure only behind HTTPS
    s = settings_in_subprocess(
        {
            "CIRVAL_VAR_DIR": str(tmp_path),
            "DJANGO_HTTPS": "1",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "x" * 50,
            "DJANGO_HSTS_SECONDS": "3600",
        }
    )
    assert s["cookies"] == [True, True, True, True, 3600, False]


def test_production_needs_a_secret_key(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as err:
        settings_in_subprocess({"CIRVAL_VAR_DIR": str(tmp_path), "DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": ""})
    assert "DJANGO_SECRET_KEY" in err.value.stderr
