"""A researcher reads the demo leaderboard (issue 40): six methods entered from an audit, three
prediction-file formats and a rank file; the four sets with intervals, tau-b, rank changes and
the rank-change chart, at 1366x768 and 1920x1080."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from annotation.studies.truth import truth_path
from audit.leaderboard.service import display_table, leaderboard_table
from audit.models import AuditRun
from tests.browser.conftest import login
from tests.leaderboard_demo import build_demo_leaderboard

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_board(db, demo_images, demo_embeddings, settings, tmp_path):
    settings.IMAGE_ROOTS = [demo_images.resolve()]
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), verbosity=0)
    run = AuditRun.objects.get(dataset__name="demo")
    return build_demo_leaderboard(run, tmp_path / "files", json.loads(truth_path("demo").read_text()))


def test_researcher_reads_the_leaderboard(page, live_server, demo_board, shot):
    login(page, live_server.url, "researcher", "researcher-demo")
    page.goto(f"{live_server.url}/leaderboards/")
    page.click(f"text={demo_board.name}")
    page.wait_for_selector("#leaderboard-scores")
    shown = display_table(leaderboard_table(demo_board))  # the page's defaults: 1000 replicates, seed 0
    headers = [h.strip() for h in page.locator("#leaderboard-scores th").all_inner_texts()]
    assert headers == shown["headers"]
    assert headers[1:5] == [
        "Full R@10",
        "Shortcut-free R@10",
        "Validated R@10",
        "Validated + accepted alternatives R@10",
    ]
    rows = page.locator("#leaderboard-scores tbody tr")
    assert rows.count() == 6
    assert [c.strip() for c in rows.nth(0).locator("td").all_inner_texts()] == shown["rows"][0]
    for r in range(6):  # every cell an interval, every method a rank change
        cells = rows.nth(r).locator("td").all_inner_texts()
        assert all("[" in c for c in cells[1:6]) and "→" in cells[6]
    assert page.inner_text("#leaderboard-tau").startswith(shown["tau"])
    assert page.locator("#leaderboard-charts svg").count() == 2
    assert "Rank change, Full → Validated" in page.inner_text("#leaderboard-charts")
    assert page.locator("#leaderboard-compgap tbody tr").count() == len(shown["gap_rows"]) >= 3
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        table = page.locator("#leaderboard-scores")
        table.scroll_into_view_if_needed()
        main = page.locator("main").bounding_box()
        assert main is not None and main["width"] <= width
        box = page.locator("#leaderboard .table-scroll").bounding_box()
        assert box is not None and box["x"] + box["width"] <= width + 1
        shot(page, f"leaderboard-{width}")
