"""Images are served only from IMAGE_ROOTS, as cached thumbnails, with bombs refused."""
from __future__ import annotations

import pytest
from PIL import Image as PILImage

from retrieval.models import Dataset, Image

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(tmp_path, settings, client, demo_accounts):
    root = tmp_path / "served"
    root.mkdir()
    settings.IMAGE_ROOTS = [root.resolve()]
    settings.THUMBNAIL_DIR = tmp_path / "thumbs"
    settings.IMAGE_MAX_PIXELS = 10_000
    PILImage.new("RGB", (80, 60), "blue").save(root / "ok.png")
    PILImage.new("RGB", (200, 200), "red").save(root / "big.png")  # 40,000 px > the limit
    (root / "fake.png").write_text("not an image")
    outside = tmp_path / "outside"
    outside.mkdir()
    PILImage.new("RGB", (10, 10)).save(outside / "secret.png")
    (root / "link.png").symlink_to(outside / "secret.png")
    ds = Dataset.objects.create(name="imgs", format="demo", images_root=str(root))
    other = Dataset.objects.create(name="elsewhere", format="demo", images_root=str(outside))
    rows = {name: Image.objects.create(dataset=ds, external_id=name, path=f"{name}.png") for name in ("ok", "big", "fake", "link")}
    rows["outside"] = Image.objects.create(dataset=other, external_id="secret", path="secret.png")
    rows["traversal"] = Image.objects.create(dataset=ds, external_id="trav", path="../outside/secret.png")
    # researchers may fetch any image (annotators only what they were shown: test_image_access.py)
    client.login(username="researcher", password=demo_accounts["researcher"])
    return rows


def test_full_image_and_thumbnail_with_cache_headers(client, served, settings):
    resp = client.get(f"/images/{served['ok'].pk}/")
    assert resp.status_code == 200 and "max-age=86400" in resp["Cache-Control"]
    thumb = client.get(f"/images/{served['ok'].pk}/?size=96")
    assert thumb.status_code == 200 and thumb["Content-Type"] == "image/png"
    body = b"".join(thumb.streaming_content)
    assert body.startswith(b"\x89PNG")
    assert len(list(settings.THUMBNAIL_DIR.rglob("*.png"))) == 1  # cached on disk
    client.get(f"/images/{served['ok'].pk}/?size=96")
    assert len(list(settings.THUMBNAIL_DIR.rglob("*.png"))) == 1
    assert client.get(f"/images/{served['ok'].pk}/?size=13").status_code == 400


@pytest.mark.parametrize("name", ["outside", "traversal", "link"])
def test_paths_outside_the_roots_are_404(client, served, name):
    assert client.get(f"/images/{served[name].pk}/").status_code == 404
    assert client.get(f"/images/{served[name].pk}/?size=96").status_code == 404


def test_decompression_bomb_and_non_image_are_refused_clearly(client, served):
    big = client.get(f"/images/{served['big'].pk}/?size=96")
    assert big.status_code == 422 and b"exceeds the limit" in big.content
    assert client.get(f"/images/{served['big'].pk}/").status_code == 422
    fake = client.get(f"/images/{served['fake'].pk}/?size=96")
    assert fake.status_code == 422 and b"not a readable image" in fake.content


def test_anonymous_gets_no_image(served):
    from django.test import Client

    assert Client().get(f"/images/{served['ok'].pk}/").status_code == 302
