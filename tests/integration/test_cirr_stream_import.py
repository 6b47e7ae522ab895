"""CIRR through the streaming import: split-file images are written a batch at a time and the
loader holds the pks of one query batch's images only; the database holds what the
in-memory path (``load_parsed(cirr.parse(...))``) writes, and a re-import counts as before.
"""

from __future__ import annotations

import json

import pytest

from retrieval import loader
from retrieval.importers import cirr
from retrieval.loader import load_parsed
from retrieval.models import GalleryEntry, Image
from retrieval.services import import_files
from tests.integration.test_mbeir_pool_import import counts, snapshot
from tests.unit.test_cirr_stream import write_cirr

pytestmark = pytest.mark.django_db


class Spy:
    """Records, at every query batch the writer writes, how many image pks it holds."""

    def __init__(self, monkeypatch) -> None:
        self.held: list[tuple[int, int]] = []  # (pks of parsed.images, pks of the batch's streamed images)
        write = loader._Writer.write_queries

        def spied(writer, batch):
            write(writer, batch)
            self.held.append((len(writer.pks), len(writer.batch_pks)))

        monkeypatch.setattr(loader._Writer, "write_queries", spied)


def test_streamed_cirr_import_holds_one_batch_and_stores_what_parse_stores(tmp_path, monkeypatch):
    monkeypatch.setattr(cirr, "BATCH", 9)
    monkeypatch.setattr(loader, "BATCH", 10)
    paths = write_cirr(tmp_path, 200)
    cap = json.loads(paths[0].read_text())
    cap[7]["target_soft"]["not-in-split"] = 0.25  # an image no split file lists: kept on the dataset
    paths[0].write_text(json.dumps(cap))
    n_split = len(json.loads(paths[1].read_text()))
    spy = Spy(monkeypatch)

    streamed = import_files("cirr", "streamed", paths)
    assert len(spy.held) == 20  # 200 queries in batches of 10
    # only the image outside the split file is held for the whole import; the others are looked
    # up for the batch that names them (10 queries name at most 60 images, of 100)
    assert max(pks for pks, _ in spy.held) == 1
    assert 0 < max(batch for _, batch in spy.held) <= 60 < n_split
    whole = load_parsed(cirr.parse(paths), "whole")
    assert counts(streamed) == counts(whole)
    assert streamed.warnings == whole.warnings
    assert any("1 referenced image(s) are not in the split file" in w for w in streamed.warnings)
    assert snapshot("streamed") == snapshot("whole")
    assert streamed.images == n_split + 1 and streamed.gallery_entries == n_split
    assert list(
        GalleryEntry.objects.filter(dataset__name="streamed")
        .order_by("ordinal")
        .values_list("image__external_id", flat=True)
    ) == list(json.loads(paths[1].read_text()))

    before = snapshot("streamed")
    again = import_files("cirr", "streamed", paths)
    assert (
        again.queries,
        again.queries_created,
        again.queries_updated,
        again.queries_unchanged,
        again.queries_removed,
    ) == (200, 0, 0, 200, 0)
    assert (again.images, again.images_created, again.images_updated) == (streamed.images, 0, 0)
    assert snapshot("streamed") == before

    # one changed caption and one changed image path: counted as such, nothing else rewritten
    cap[3]["caption"] = "a new caption"
    paths[0].write_text(json.dumps(cap))
    split = json.loads(paths[1].read_text())
    first = next(iter(split))
    split[first] = "./dev/moved.png"
    paths[1].write_text(json.dumps(split))
    changed = import_files("cirr", "streamed", paths)
    assert (changed.queries_created, changed.queries_updated, changed.queries_unchanged) == (0, 1, 199)
    assert (changed.images_created, changed.images_updated) == (0, 1)
    assert Image.objects.get(dataset__name="streamed", external_id=first).path == "dev/moved.png"


def test_a_bad_caption_after_written_image_batches_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cirr, "BATCH", 5)
    monkeypatch.setattr(loader, "BATCH", 5)
    paths = write_cirr(tmp_path, 30)
    cap = json.loads(paths[0].read_text())
    cap[23]["pairid"] = 4
    paths[0].write_text(json.dumps(cap))
    with pytest.raises(ValueError, match=r"record 24, field 'pairid': duplicate pairid 4 \(first at record 5\)"):
        import_files("cirr", "broken", paths)
    assert not Image.objects.exists() and not GalleryEntry.objects.exists()
