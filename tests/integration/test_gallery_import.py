"""import_gallery: CIRCO's COCO gallery from a folder or a list of ids, then audited over it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.protocol import run_protocol
from retrieval.galleries import gallery_image_ids, query_gallery_keys
from retrieval.models import Dataset, GalleryEntry, Image, Query
from tests.conftest import FIXTURES
from tests.integration.test_protocol_audit import audit, cache_dir, draw_images  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def circo(tmp_path):
    val = json.loads((FIXTURES / "datasets" / "circo" / "val.json").read_text())[:20]
    (tmp_path / "val.json").write_text(json.dumps(val))
    used = {r["reference_img_id"] for r in val} | {g for r in val for g in r["gt_img_ids"]}
    unlabeled = set(range(1, 201)) - used  # the rest of a (small) COCO unlabeled gallery
    draw_images(tmp_path / "img" / "unlabeled2017", [f"{i:012d}.jpg" for i in used | unlabeled])
    call_command(
        "import_dataset",
        "--format",
        "circo",
        "--name",
        "circo",
        "--images-root",
        str(tmp_path / "img" / "unlabeled2017"),
        str(tmp_path / "val.json"),
        stdout=StringIO(),
    )
    return Dataset.objects.get(name="circo"), used, unlabeled


def gallery(*args) -> dict:
    out = StringIO()
    call_command("import_gallery", "--dataset", "circo", "--format", "json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_folder_gallery_is_searched_by_the_audit_and_still_warned_as_small(tmp_path, circo, cache_dir):  # noqa: F811
    ds, used, unlabeled = circo
    n_before = Image.objects.filter(dataset=ds).count()
    report = gallery("--split", "val", "--folder", str(tmp_path / "img" / "unlabeled2017"))
    assert report["listed"] == len(used | unlabeled)
    assert report["images_created"] == len(unlabeled)  # the annotation images are reused
    assert Image.objects.filter(dataset=ds).count() == n_before + len(unlabeled)
    assert report["gallery_sizes"] == {"val": len(used | unlabeled)} and report["missing"] == 0
    # every CIRCO query now searches the imported gallery
    assert set(query_gallery_keys(Query.objects.filter(dataset=ds).values("pk")).values()) == {"val"}
    # a second import adds nothing
    again = gallery("--split", "val", "--folder", str(tmp_path / "img" / "unlabeled2017"))
    assert again["images_created"] == again["entries_created"] == 0

    run = audit(ds)
    assert run.summary["plan"]["gallery"]["source"] == "split gallery"
    assert run.summary["plan"]["gallery"]["images"] == len(used | unlabeled)
    warnings = run_protocol(run)["warnings"]
    assert any(f"{len(used | unlabeled):,} images, not CIRCO's 123,403" in w for w in warnings)


def test_ids_from_coco_image_info_and_lists(tmp_path, circo):
    ds, used, unlabeled = circo
    info = {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in sorted(unlabeled)[:50]]}
    (tmp_path / "info.json").write_text(json.dumps(info))
    report = gallery("--split", "val", "--split", "test", "--ids", str(tmp_path / "info.json"))
    assert report["gallery_sizes"] == {"val": 50, "test": 50}
    (tmp_path / "ids.txt").write_text("\n".join(str(i) for i in [*sorted(used), 999999]) + "\n")
    report = gallery("--split", "val", "--ids", str(tmp_path / "ids.txt"))
    assert report["missing"] == 1 and report["missing_examples"][0].startswith("999999")
    assert report["gallery_sizes"]["val"] == 50 + len(used) + 1
    # the missing image is listed but an audit cannot encode it
    assert len(gallery_image_ids(ds.pk, "val", readable=True)) == 50 + len(used)
    assert GalleryEntry.objects.filter(dataset=ds, split="val").order_by("ordinal").first().image.external_id == str(
        sorted(unlabeled)[0]
    )


def test_bad_ids_are_refused_with_the_line(tmp_path, circo):
    (tmp_path / "ids.txt").write_text("1\n2\nabc\n")
    with pytest.raises(CommandError, match=r"ids.txt line 3: 'abc' is not a COCO image id"):
        gallery("--split", "val", "--ids", str(tmp_path / "ids.txt"))
    assert not GalleryEntry.objects.exists()  # nothing written
    with pytest.raises(CommandError, match="not inside the dataset's images root"):
        gallery("--split", "val", "--folder", str(tmp_path))
