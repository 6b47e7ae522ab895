"""``./cirval up`` starts quietly (issue 41): one progress line with the time left, no warning
for a state that is expected, label counts apart from their union, each request logged once."""

from __future__ import annotations

import io
import logging

import pytest

from audit.labels import LABELS, SHORTCUT_FREE_LABELS, SHORTCUT_FREE_NAME, count_lines
from retrieval.jobs.job_progress import ProgressLine, format_eta


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_format_eta():
    assert format_eta(None) == "?"
    assert format_eta(0) == "0:00:00"
    assert format_eta(3725.4) == "1:02:05"


def test_progress_line_not_on_a_tty_prints_a_line_per_tenth_of_the_work():
    out = io.StringIO()
    line = ProgressLine(out)
    for step in range(1001):
        line.update(f"step {step}/1000", step / 1000)
    line.close()
    printed = out.getvalue().splitlines()
    assert printed == [f"step {n}/1000" for n in range(0, 1001, 100)]
    assert "\r" not in out.getvalue()


def test_progress_line_close_prints_a_last_text_once():
    out = io.StringIO()
    line = ProgressLine(out)
    line.update("half", 0.5)
    line.close("done in 3 s")
    assert out.getvalue().splitlines() == ["half", "done in 3 s"]


def test_progress_line_on_a_tty_is_rewritten_in_place_and_ends_with_a_newline():
    out, clock = Tty(), Clock()
    line = ProgressLine(out, clock=clock)
    for step in range(100):
        clock.now = step * 0.05  # 20 updates a second, drawn twice a second
        line.update(f"step {step}", step / 100)
        line.update(f"step {step}", step / 100)  # the same text is not drawn again
    line.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("step 99\n")
    frames = text.split("\r\033[K")[1:]
    assert 10 <= len(frames) <= 12  # 5 s at one frame per 0.5 s, and the closing one
    assert len(set(frames[:-1])) == len(frames) - 1


def test_progress_line_writes_through_a_command_output_wrapper():
    from django.core.management.base import OutputWrapper

    raw = io.StringIO()
    line = ProgressLine(OutputWrapper(raw))
    line.update("a", 0.0)
    line.close("b")
    assert raw.getvalue() == "a\nb\n"


def test_the_label_counts_are_apart_from_their_union():
    counts = {LABELS[0]: 40, LABELS[1]: 19, LABELS[2]: 101, SHORTCUT_FREE_NAME: 59}
    lines = count_lines(counts)
    assert [ln.split()[0] for ln in lines[:3]] == list(LABELS)
    assert lines[3].split()[-1] == "160"  # the labels sum to the queries
    assert lines[4].split()[:2] == [SHORTCUT_FREE_NAME, "59"]
    assert " + ".join(SHORTCUT_FREE_LABELS) in lines[4]
    assert count_lines({})[3].split()[-1] == "0"


def test_the_filesystem_broker_names_no_host(caplog, tmp_path):
    from kombu import Connection

    from config import fsbroker

    fsbroker.register()
    caplog.set_level(logging.WARNING, logger="kombu")
    conn = Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(tmp_path),
            "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control"),
        },
    )
    clone = conn.clone()
    with clone.SimpleQueue("q") as queue:
        queue.put({"n": 1})
        message = queue.get(timeout=1)
        message.ack()
    assert message.payload == {"n": 1}
    assert [r.getMessage() for r in caplog.records if "hostname" in r.getMessage()] == []


@pytest.mark.parametrize("status, logged", [(200, True), (404, True), (500, False)])
def test_runserver_logs_a_request_once(settings, status, logged):
    """The access line says every request but a 5xx, which django.request logs with its
    traceback; django.request says nothing of a 4xx (the access line does)."""
    from logging.config import dictConfig

    dictConfig(settings.LOGGING)
    server = logging.getLogger("django.server")
    record = server.makeRecord(
        "django.server",
        logging.INFO,
        __file__,
        1,
        '"GET / HTTP/1.1" %s',
        (status,),
        None,
        extra={"status_code": status},
    )
    assert all(f.filter(record) for f in server.filters) is logged
    assert not server.propagate and server.handlers
    assert logging.getLogger("django.request").getEffectiveLevel() == logging.ERROR
    assert logging.getLogger("django").handlers == []
