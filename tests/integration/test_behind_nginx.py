"""The login lockout behind a real nginx (issue 41, item 2): locked from one client address,
the owner gets in from another.

Each test starts gunicorn on loopback (as docs/guides/production.md runs it) against the
test database and Debian's nginx in front of it on an unprivileged port, with the proxy lines
of deploy/nginx/cirval-proxy.conf included unchanged. Client addresses are real: a client
connects from its own loopback address (127.0.0.2, 127.0.0.3: Linux routes all of 127/8 to
``lo``), so nginx's ``$remote_addr`` differs per client, exactly as on the Internet.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import ROOT, database_url_for_subprocess, make_annotator, wait_for

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PROXY_LINES = ROOT / "deploy" / "nginx" / "cirval-proxy.conf"
SITE = ROOT / "deploy" / "nginx" / "cirval.conf"
PASSWORD = "pw-annotator3-1234"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_conf(folder: Path, port: int, app_port: int) -> Path:
    """A whole nginx.conf for an unprivileged nginx: everything it writes under ``folder``,
    the app's proxy lines included as deployed (only the listen line is the test's)."""
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(f"""
daemon off;
master_process off;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    upstream cirval {{ server 127.0.0.1:{app_port}; keepalive 4; }}
    server {{
        listen 127.0.0.1:{port};
        server_name 127.0.0.1;
        include {PROXY_LINES};
    }}
}}
""")
    return conf


class Servers:
    """gunicorn (CIRVAL_PROXY_COUNT=count) behind nginx; stopped by :meth:`stop`."""

    def __init__(self, folder: Path, count: int):
        self.folder, self.count = folder, count
        self.app_port, self.port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []

    def start(self) -> Servers:
        env = dict(
            os.environ,
            DATABASE_URL=database_url_for_subprocess(),
            CIRVAL_VAR_DIR=str(settings.VAR_DIR),
            CIRVAL_PROXY_COUNT=str(self.count),
            DJANGO_DEBUG="0",
            DJANGO_SECRET_KEY="behind-nginx-" * 4,
            DJANGO_ALLOWED_HOSTS="127.0.0.1",
            CACHE_URL="",
            AXES_FAILURE_LIMIT="5",
            PYTHONUNBUFFERED="1",
        )
        env.pop("AXES_PROXY_COUNT", None)
        self.spawn(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi",
                "-b",
                f"127.0.0.1:{self.app_port}",
                "-k",
                "gthread",
                "-w",
                "1",
                "--threads",
                "4",
            ],
            env,
            "gunicorn.log",
        )
        wait_for(lambda: self.answers(self.app_port), timeout=120, what="gunicorn")
        conf = nginx_conf(self.folder, self.port, self.app_port)
        self.spawn(
            [NGINX, "-p", str(self.folder), "-c", str(conf), "-e", str(self.folder / "error.log")],
            dict(os.environ),
            "nginx.out",
        )
        wait_for(lambda: self.answers(self.port), timeout=30, what="nginx")
        return self

    def spawn(self, argv: list[str], env: dict, log: str) -> None:
        out = open(self.folder / log, "w")
        self.procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def answers(self, port: int) -> bool:
        for p in self.procs:
            assert p.poll() is None, f"{p.args[0]} died: {self.logs()}"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz?live=1")
            return conn.getresponse().status == 200
        except OSError:
            return False

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}"
            for p in sorted(self.folder.glob("*.log")) + [self.folder / "nginx.out"]
            if p.exists()
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)


class Browser:
    """One client: its own source address (its TCP peer address at nginx) and cookies."""

    def __init__(self, port: int, source: str = "127.0.0.1"):
        self.port, self.source, self.cookies = port, source, {}

    def request(self, method: str, path: str, body: str | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30, source_address=(self.source, 0))
        headers = {"Host": "127.0.0.1", **(headers or {})}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        for name, value in resp.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                self.cookies[key] = rest.split(";", 1)[0]
        return resp.status, resp.read().decode("utf-8", "replace")

    def login(self, username: str, password: str, xff: str | None = None) -> int:
        """The login form, as a browser sends it (CSRF token from the page); ``xff``: an
        ``X-Forwarded-For`` header the client (or a balancer in front of nginx) sends."""
        extra = {"X-Forwarded-For": xff} if xff else {}
        status, page = self.request("GET", "/login/", headers=extra)
        assert status == 200, (status, page[:300])
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token})
        status, page = self.request(
            "POST", "/login/", form, {"Content-Type": "application/x-www-form-urlencoded", **extra}
        )
        self.last_page = page
        return status


@pytest.fixture
def behind_nginx(transactional_db, tmp_path):
    """``start(count)``: gunicorn with CIRVAL_PROXY_COUNT=count behind nginx; its port."""
    assert Path(NGINX).exists(), (
        "the nginx tests need Debian's nginx (./cirval test installs it: apt-get install nginx)"
    )
    from django.contrib.auth.hashers import make_password

    user = make_annotator("annotator3")
    user.password = make_password(PASSWORD, hasher="pbkdf2_sha256")  # the server's hasher, not the tests' fast one
    user.save(update_fields=["password"])
    started: list[Servers] = []

    def start(count: int) -> Servers:
        folder = tmp_path / f"proxies-{count}"
        folder.mkdir()
        started.append(Servers(folder, count).start())
        return started[-1]

    yield start
    for s in started:
        s.stop()


def locked_addresses() -> set[str]:
    """The addresses django-axes recorded annotator3's failures at."""
    from axes.models import AccessAttempt

    return set(AccessAttempt.objects.filter(username="annotator3").values_list("ip_address", flat=True))


def test_locked_from_one_client_address_the_owner_gets_in_from_another(behind_nginx):
    """nginx alone (CIRVAL_PROXY_COUNT=1): six wrong passwords from 127.0.0.2 lock annotator3
    there, whatever X-Forwarded-For the attacker makes up (even the owner's address); the
    owner, at 127.0.0.3, gets in."""
    servers = behind_nginx(1)
    attacker, owner = Browser(servers.port, "127.0.0.2"), Browser(servers.port, "127.0.0.3")
    codes = [attacker.login("annotator3", "wrong", xff=f"198.51.100.{n}") for n in range(5)]
    codes.append(attacker.login("annotator3", "wrong", xff="127.0.0.3"))  # posing as the owner
    assert codes[0] == 200 and codes[-1] == 429, (codes, servers.logs())
    assert attacker.login("annotator3", PASSWORD, xff="127.0.0.3") == 429  # the right password, still locked here
    assert locked_addresses() == {"127.0.0.2"}  # the made-up addresses were never read
    assert owner.login("annotator3", PASSWORD) == 302, owner.last_page
    assert "sessionid" in owner.cookies
    # the requests went through nginx, which saw both clients' real addresses
    log = (servers.folder / "access.log").read_text()
    assert "127.0.0.2 - " in log and "127.0.0.3 - " in log


def test_behind_a_balancer_and_nginx_the_attack_of_issue_41_locks_only_the_attackers_address(behind_nginx):
    """A load balancer, then nginx (CIRVAL_PROXY_COUNT=2); the test plays the balancer, which
    appends the client it saw to X-Forwarded-For. Six wrong passwords for annotator3 from
    203.0.113.9 do not lock the owner out at 198.51.100.7 (they got 429 there before)."""
    servers = behind_nginx(2)
    balancer = Browser(servers.port)  # every request reaches nginx from the balancer's address
    codes = [balancer.login("annotator3", "wrong", xff="203.0.113.9") for _ in range(6)]
    assert codes[0] == 200 and codes[-1] == 429, (codes, servers.logs())
    # what the attacker wrote to the left of the balancer's entry is not read
    assert balancer.login("annotator3", PASSWORD, xff="198.51.100.7, 203.0.113.9") == 429
    assert locked_addresses() == {"203.0.113.9"}
    owner = Browser(servers.port)
    assert owner.login("annotator3", PASSWORD, xff="198.51.100.7") == 302, servers.logs()


def test_the_docs_show_the_proxy_lines_the_test_runs():
    """The production guide (docs/guides/production.md) shows deploy/nginx/cirval-proxy.conf's
    directives as they are; it and SECURITY.md name the setting; the site file includes the
    proxy lines."""
    directives = [
        line.split("#")[0].strip()
        for line in PROXY_LINES.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    production = (ROOT / "docs/guides/production.md").read_text()
    shown = [line.split("#")[0].strip() for line in production.splitlines()]
    missing = [d for d in directives if d not in shown]
    assert not missing, f"docs/guides/production.md lacks these lines of {PROXY_LINES.name}: {missing}"
    security = (ROOT / "SECURITY.md").read_text()
    for doc in (production, security):
        assert "CIRVAL_PROXY_COUNT=1" in doc
        assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in doc
    assert "include /etc/nginx/snippets/cirval-proxy.conf;" in SITE.read_text()


def test_the_site_file_is_valid_nginx(tmp_path):
    """``nginx -t`` on deploy/nginx/cirval.conf, its certificate and snippet paths pointed at
    the test's (a throwaway self-signed certificate)."""
    assert Path(NGINX).exists(), (
        "the nginx tests need Debian's nginx (./cirval test installs it: apt-get install nginx)"
    )
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command for a throwaway certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    site = SITE.read_text()
    site = re.sub(r"ssl_certificate (\S+);", f"ssl_certificate {cert};", site)
    site = re.sub(r"ssl_certificate_key (\S+);", f"ssl_certificate_key {key};", site)
    site = site.replace("/etc/nginx/snippets/cirval-proxy.conf", str(PROXY_LINES))
    (tmp_path / "site.conf").write_text(site)
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{ access_log off; include {tmp_path}/site.conf; }}\n"
    )
    out = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "syntax is ok" in out.stderr, out.stderr
