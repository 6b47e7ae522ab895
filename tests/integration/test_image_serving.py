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
    rows = {
        name: Image.objects.create(dataset=ds, external_id=name, path=f"{name}.png")
        for name in ("ok", "big", "fake", "link")
    }
    rows["outside"] = Image.objects.create(dataset=other, external_id="secret", path="secret.png")
    rows["traversal"] = Image.objects.create(dataset=ds, external_id="trav", path="../outside/secret.png")
    # researchers may fetch any image (annotators only what they were shown: test_hardening.py)
    client.login(username="researcher", password=demo_accounts["researcher"])
    return rows


def test_full_image_and_thumbnail_with_cache_headers(client, served, settings):
    resp = client.get(f"/images/{served['ok'].pk}/")
    assert resp.status_code == 200 and "max-age=86400" in resp["Cache-Control"]
    thumb = client.get(f"/images/{served['ok'].pk}/?size=96")
    assert thumb.status_code == 200 and thumb["Content-Type"] == "image/png"
    body = b"".join(thumb.streaming_content)
    assert body.startswith(b"\x89PNG")
    from retrieval.imageserve import THUMB_SIZES

    assert len(list(settings.THUMBNAIL_DIR.rglob("*.png"))) == len(THUMB_SIZES)  # every size, from one decode
    client.get(f"/images/{served['ok'].pk}/?size=160")
    assert len(list(settings.THUMBNAIL_DIR.rglob("*.png"))) == len(THUMB_SIZES)
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


def test_truncated_png_thumbnail_is_422_without_the_path(client, served, tmp_path, settings):
    import io

    buf = io.BytesIO()
    PILImage.effect_noise((90, 90), 64).convert("RGB").save(buf, format="PNG")
    root = settings.IMAGE_ROOTS[0]
    (root / "cut.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])  # header fine, data cut
    cut = Image.objects.create(dataset=served["ok"].dataset, external_id="cut", path="cut.png")
    resp = client.get(f"/images/{cut.pk}/?size=96")
    assert resp.status_code == 422 and b"not a readable image" in resp.content
    assert str(root).encode() not in resp.content and b"cut.png" not in resp.content
    assert not list(settings.THUMBNAIL_DIR.rglob("*.tmp"))
    fake = client.get(f"/images/{served['fake'].pk}/")
    assert fake.status_code == 422 and str(root).encode() not in fake.content


def test_served_files_carry_the_image_id_not_the_file_name(client, served):
    full = client.get(f"/images/{served['ok'].pk}/")
    assert full.status_code == 200 and f'filename="image-{served["ok"].pk}.png"' in full["Content-Disposition"]
    thumb = client.get(f"/images/{served['ok'].pk}/?size=96")
    assert "ok.png" not in thumb.get("Content-Disposition", "") and "ok.png" not in full["Content-Disposition"]


@pytest.mark.parametrize("size", ["²", "٣", "-1", "96.0", "1" * 40, "\x00"])
def test_hostile_sizes_are_400(client, served, size):
    assert client.get(f"/images/{served['ok'].pk}/", {"size": size}).status_code == 400


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_truncated_image_is_never_served_at_full_size(client, served, settings, fmt):
    """Issue 29: a truncated PNG was served at full size. Each file is verified (once)."""
    import io

    buf = io.BytesIO()
    PILImage.effect_noise((90, 90), 64).convert("RGB").save(buf, format=fmt)
    root = settings.IMAGE_ROOTS[0]
    name = f"cut.{fmt.lower()}"
    (root / name).write_bytes(buf.getvalue()[: len(buf.getvalue()) * 2 // 3])
    cut = Image.objects.create(dataset=served["ok"].dataset, external_id="cut", path=name)
    resp = client.get(f"/images/{cut.pk}/")
    assert (
        resp.status_code == 422 and b"damaged or truncated" in resp.content and str(root).encode() not in resp.content
    )
    assert not list(settings.THUMBNAIL_DIR.rglob("*.ok"))  # nothing remembered as good
    good = client.get(f"/images/{served['ok'].pk}/")
    assert good.status_code == 200 and len(list(settings.THUMBNAIL_DIR.rglob("*.ok"))) == 1


def test_thumbnails_of_one_image_are_built_once_under_a_memory_cap(served, settings, monkeypatch):
    """Five sizes requested together decode the image once (all sizes from one decode, under
    the image's lock); a decode over IMAGE_DECODE_MAX_BYTES is refused before it starts."""
    from concurrent.futures import ThreadPoolExecutor

    from retrieval import imageserve

    root = settings.IMAGE_ROOTS[0]
    PILImage.effect_noise((90, 90), 64).convert("RGB").save(root / "five.png")
    builds = []
    real = imageserve._build_thumbnails

    def counted(path):
        builds.append(path)
        return real(path)

    monkeypatch.setattr(imageserve, "_build_thumbnails", counted)
    with ThreadPoolExecutor(5) as pool:
        outs = list(pool.map(lambda size: imageserve.thumbnail(root / "five.png", size), imageserve.THUMB_SIZES))
    assert len(builds) == 1 and all(o.exists() for o in outs)
    settings.IMAGE_DECODE_MAX_BYTES = 90 * 90 * 3 - 1
    PILImage.effect_noise((90, 90), 64).convert("RGB").save(root / "over.png")
    with pytest.raises(imageserve.ImageRefused, match="more than the 0 MB allowed"):
        imageserve.thumbnail(root / "over.png", 96)
