"""The demo leaderboard (issue 40): six methods entered from an audit, three prediction-file
formats and a rank file; the page shows the four sets, intervals, tau-b and rank changes, and
the CSV / JSON / LaTeX of ``manage.py leaderboard`` print the same strings."""

from __future__ import annotations

import csv
import io
import json
import re
from html import unescape
from io import StringIO

import pytest
from django.core.management import call_command

from annotation.studies.truth import truth_path
from audit.leaderboard.scoring import FULL, SETS, VALIDATED, VALIDATED_ALTERNATIVES
from audit.leaderboard.service import display_table, leaderboard_table, pct
from audit.models import AuditRun, LeaderboardEntry
from tests.leaderboard_demo import build_demo_leaderboard

pytestmark = pytest.mark.django_db


@pytest.fixture
def board(demo_db, tmp_path):
    run = AuditRun.objects.filter(dataset__name="demo", status="done").latest("pk")
    truth = json.loads(truth_path("demo").read_text())
    return build_demo_leaderboard(run, tmp_path / "files", truth), run


def _cells(html: str, table_id: str) -> list[list[str]]:
    part = html[html.index(f'id="{table_id}"') :]
    part = part[: part.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", part, re.S)
    return [
        [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
        for r in rows
    ]


def test_demo_leaderboard_scores_every_set_and_its_files_equal_the_page(board, client, demo_accounts, tmp_path):
    board, run = board
    assert board.entries.count() == 6
    assert {e.source for e in board.entries.all()} == set(LeaderboardEntry.Source.values)
    data = leaderboard_table(board, n_boot=200, seed=0)
    assert [s["key"] for s in data["sets"]] == list(SETS)
    assert all(s["queries"] > 0 for s in data["sets"])
    for row in data["rows"]:
        for s in SETS:
            cell = row["cells"][s]
            assert cell["value"] is not None and cell["low"] <= cell["value"] <= cell["high"], (row["name"], s)
        assert row["rank_change"] is not None
    # the audit retriever equals the audit's own Recall@10 over the same queries (no protocol: the demo)
    a = next(r for r in data["rows"] if r["name"] == "demo retriever A")
    assert a["cells"][FULL]["value"] == pytest.approx(
        run.summary["retriever_stats"][run.retrievers[0]]["recall_at_k"]["multimodal"]
    )
    # alternatives only add positives
    assert all(r["cells"][VALIDATED_ALTERNATIVES]["value"] >= r["cells"][VALIDATED]["value"] for r in data["rows"])
    assert a["comp_gap"][FULL] is not None and data["tau"]["value"] is not None

    # the same seed, the same intervals
    assert leaderboard_table(board, n_boot=200, seed=0) == data

    assert client.login(username="researcher", password=demo_accounts["researcher"])
    html = client.get(f"/leaderboards/{board.pk}/?bootstrap=200&seed=0").content.decode()
    shown = display_table(data)
    page = _cells(html, "leaderboard-scores")
    assert page[0] == shown["headers"] and page[1:] == shown["rows"]
    assert _cells(html, "leaderboard-compgap")[1:] == shown["gap_rows"]
    assert shown["tau"] in unescape(html)
    assert html.count("<svg") >= 1 and "Rank change" in html

    out = tmp_path / "out"
    call_command(
        "leaderboard",
        "--dataset",
        "demo",
        "--split",
        "val",
        "--name",
        board.name,
        "--out",
        str(out),
        "--bootstrap",
        "200",
        "--seed",
        "0",
        stdout=StringIO(),
    )
    stem = out / board.name
    written = list(csv.reader(io.StringIO((stem.with_suffix(".csv")).read_text())))
    assert written[0] == shown["headers"] and written[1 : 1 + len(shown["rows"])] == shown["rows"]
    assert json.loads(stem.with_suffix(".json").read_text()) == json.loads(json.dumps(data))
    tex = stem.with_suffix(".tex").read_text()
    for row in data["rows"]:
        assert pct(row["cells"][FULL]["value"]) in tex
    assert tex.count(r"\\") >= len(data["rows"]) + 1 and r"\toprule" in tex


def test_release_writes_the_table_and_the_card_shows_it(board, tmp_path):
    from types import SimpleNamespace

    from annotation.release.leaderboards import FOLDER, leaderboard_lines, stem, write_leaderboards

    board, run = board
    parts = [SimpleNamespace(runs={"demo": run})]
    paths = write_leaderboards(parts, tmp_path / "release")
    assert sorted(p.name for p in paths) == sorted(f"{stem(board)}.{s}" for s in ("csv", "json", "tex"))
    assert all(p.parent == tmp_path / "release" / FOLDER for p in paths)
    data = json.loads((tmp_path / "release" / FOLDER / f"{stem(board)}.json").read_text())
    shown = display_table(data)
    card = "\n".join(leaderboard_lines(parts))
    assert "## Leaderboards before and after cleaning" in card
    for row in shown["rows"] + shown["gap_rows"]:
        assert "| " + " | ".join(row) + " |" in card
    assert shown["tau"] in card


def test_demo_check_prints_circus_tables(demo_db):
    out = StringIO()
    call_command("demo_check", stdout=out)
    text = out.getvalue()
    run = AuditRun.objects.filter(dataset__name="demo", status="done").latest("pk")
    assert f"Recall@{run.k} (multimodal, %)" in text and "Composition Gap on nDCG" in text
    stats = run.summary["retriever_stats"][run.retrievers[0]]
    line = next(x for x in text.splitlines() if x.strip().startswith(run.retrievers[0]))
    assert line.split()[-3] == f"{100 * stats['recall_at_k']['multimodal']:.1f}"
    free = run.summary["shortcut_free_stats"][run.retrievers[0]]["recall_at_k"]["multimodal"]
    assert line.split()[-2] == f"{100 * free:.1f}" and line.split()[-1] == "-"  # no validated export in the demo yet
