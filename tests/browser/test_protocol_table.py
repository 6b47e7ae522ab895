"""The audit page's protocol table (FashionIQ: three categories of one dataset, each against its
own gallery) as a researcher reads it, at 1366x768 and 1920x1080."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.models import Dataset
from tests.browser.conftest import login
from tests.conftest import FIXTURES
from tests.integration.test_protocol_audit import SPEC, draw_images

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fiq_run(tmp_path, settings, demo_accounts):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    clear_memos()
    files = sorted((FIXTURES / "datasets" / "fashioniq").glob("*.val.sample.json"))
    asins = {a for f in files if f.name.startswith("split.") for a in json.loads(f.read_text())}
    asins |= {
        r[k]
        for f in files
        if f.name.startswith("cap.")
        for r in json.loads(f.read_text())
        for k in ("candidate", "target")
    }
    draw_images(tmp_path / "img", [f"{a}.jpg" for a in asins])
    settings.IMAGE_ROOTS = [(tmp_path / "img").resolve()]
    call_command(
        "import_dataset",
        "--format",
        "fashioniq",
        "--name",
        "fiq",
        "--images-root",
        str(tmp_path / "img"),
        *map(str, files),
        stdout=StringIO(),
    )
    run = dispatch.run_inline(planning.create_run(Dataset.objects.get(name="fiq"), [SPEC], chunk_gallery=200))
    assert run.status == "done", run.error
    yield run
    clear_memos()


def test_protocol_table_reads_like_a_paper(page, live_server, fiq_run, shot):
    login(page, live_server.url, "researcher", "researcher-demo")
    page.goto(f"{live_server.url}/audits/{fiq_run.pk}/")
    table = page.locator("#protocol")
    text = table.inner_text()
    assert "FashionIQ, as its protocol reports it" in text and "kept" in text
    headers = [h.strip() for h in table.locator("th").all_inner_texts()]
    assert headers[:4] == ["Retriever", "Modality", "dress R@10", "dress R@50"]
    assert headers[-3:] == ["mean R@10", "mean R@50", "Avg"]
    assert table.locator("tbody tr").count() == 3
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        table.scroll_into_view_if_needed()
        box = table.bounding_box()
        assert box is not None and box["width"] <= width
        page.screenshot(path=str(shot(page, f"audit-protocol-{width}").with_name(f"audit-protocol-view-{width}.png")))
