"""M-BEIR pools through the streaming import: the database holds what the in-memory path writes.

``import_files`` (what import_dataset and the upload worker run) streams pool images to the
loader in batches; ``load_parsed(mbeir.parse(...))`` keeps them all on the ParsedDataset.
Both must store the same rows and report the same counts and warnings; a re-import of
unchanged files writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.importers import mbeir
from retrieval.loader import LoadReport, load_parsed
from retrieval.models import Dataset, GalleryEntry, Image, Query, Target, Turn
from retrieval.services import import_files
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

FIXTURE = [
    FIXTURES / "datasets" / "mbeir" / n
    for n in ("mbeir_cirr_task7_test.jsonl", "mbeir_cirr_task7_cand_pool.jsonl", "mbeir_cirr_task7_test_qrels.txt")
]
COUNTS = (
    "queries",
    "queries_created",
    "turns",
    "targets",
    "images",
    "images_created",
    "missing_images",
    "gallery_entries",
)


def snapshot(name: str) -> dict:
    """What an import stored, by external ids (primary keys differ between datasets)."""
    ds = Dataset.objects.get(name=name)
    return {
        "images": sorted(Image.objects.filter(dataset=ds).values_list("external_id", "path", "extra", "missing")),
        "gallery": sorted(
            GalleryEntry.objects.filter(dataset=ds).values_list("split", "image__external_id", "ordinal")
        ),
        "queries": sorted(
            Query.objects.filter(dataset=ds).values_list("split", "external_id", "ordinal", "content_hash")
        ),
        "turns": sorted(
            Turn.objects.filter(query__dataset=ds).values_list(
                "query__external_id", "index", "reference_image__external_id"
            )
        ),
        "targets": sorted(
            Target.objects.filter(query__dataset=ds).values_list(
                "query__external_id", "image__external_id", "relevance", "is_primary", "role", "source_field"
            )
        ),
    }


def counts(report: LoadReport) -> dict:
    return {key: getattr(report, key) for key in COUNTS}


def pool_line(did: str, img: str | None, **more) -> str:
    return json.dumps(
        {"txt": None, "img_path": img, "modality": "image", "did": did, "src_content": json.dumps({"id": did}), **more}
    )


def synthetic(tmp_path: Path, n_pool: int) -> list[Path]:
    """A pool of ``n_pool`` lines (every 10th text-only) plus an overlapping second pool, queries, qrels."""
    pool = tmp_path / "mbeir_cirr_task7_test_cand_pool.jsonl"
    pool.write_text(
        "\n".join(pool_line(f"8:{n}", None if n % 10 == 9 else f"img/{n}.jpg") for n in range(n_pool)) + "\n"
    )
    extra = tmp_path / "mbeir_extra_test_cand_pool.jsonl"
    extra.write_text("\n".join([pool_line("8:0", "img/0.jpg"), pool_line(f"8:{n_pool}", f"img/{n_pool}.jpg")]) + "\n")
    val = tmp_path / "mbeir_extra_val_cand_pool.jsonl"  # a did of the test pool, completed with a caption
    val.write_text(pool_line("8:1", "img/1.jpg", txt="a caption") + "\n")
    queries = tmp_path / "mbeir_cirr_task7_test.jsonl"
    qrels = tmp_path / "mbeir_cirr_task7_test_qrels.txt"
    lines, rels = [], []
    for i in range(40):
        target = f"8:{(i * 37) % (n_pool + 5)}"  # some past the pool, some text-only: in no pool
        lines.append(
            json.dumps(
                {
                    "qid": f"7:{i}",
                    "query_txt": f"q {i}",
                    "query_img_path": f"img/{(i * 11) % n_pool}.jpg",
                    "query_modality": "image,text",
                    "query_src_content": "{}",
                    "pos_cand_list": [target],
                    "neg_cand_list": [f"8:{i}"] if i != (i * 37) % (n_pool + 5) else [],
                    "task_id": 7,
                }
            )
        )
        rels.append(f"7:{i} 0 8:{(i * 13) % n_pool} 1 7")
    queries.write_text("\n".join(lines) + "\n")
    qrels.write_text("\n".join(rels) + "\n")
    return [queries, pool, extra, val, qrels]


def expected_counts(paths: list[Path]) -> dict[str, set[str]]:
    """Read independently with ``json``: pool image dids, target dids in no pool, query images
    outside the pools, (split, did) gallery entries."""
    queries, pools, qrels = paths[0], paths[1:-1], paths[-1]
    rows = [json.loads(line) for pool in pools for line in pool.read_text().splitlines()]
    pool = {r["did"] for r in rows if r["img_path"]}
    paths_in_pool = {r["img_path"] for r in rows if r["img_path"]}
    records = [json.loads(line) for line in queries.read_text().splitlines()]
    targets = {d for r in records for d in r["pos_cand_list"] + r["neg_cand_list"]}
    targets |= {line.split()[2] for line in qrels.read_text().splitlines()}
    outside = {r["query_img_path"] for r in records} - paths_in_pool
    galleries = {
        (("val" if "_val_" in p.name else "test"), json.loads(line)["did"])
        for p in pools
        for line in p.read_text().splitlines()
        if json.loads(line)["img_path"]
    }
    return {"pool": pool, "missing": targets - pool, "outside": outside, "gallery": galleries}


def test_fixture_streamed_import_stores_what_the_in_memory_path_stores():
    streamed = import_files("mbeir", "streamed", FIXTURE)
    whole = load_parsed(mbeir.parse(FIXTURE), "whole")
    assert counts(streamed) == counts(whole)
    assert streamed.warnings == whole.warnings and any("8:9" in w for w in streamed.warnings)
    assert snapshot("streamed") == snapshot("whole")
    pool = [json.loads(line) for line in FIXTURE[1].read_text().splitlines() if line.strip()]
    assert streamed.gallery_entries == len(pool)
    assert [
        e.image.external_id
        for e in GalleryEntry.objects.filter(dataset__name="streamed", split="test")
        .select_related("image")
        .order_by("ordinal")
    ] == [r["did"] for r in pool]


def test_pool_across_many_batches_matches_and_reimport_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(mbeir, "POOL_BATCH", 7)
    paths = synthetic(tmp_path, 60)
    streamed = import_files("mbeir", "streamed", paths)
    whole = load_parsed(mbeir.parse(paths), "whole")
    assert counts(streamed) == counts(whole)
    expected = expected_counts(paths)
    assert streamed.images == len(expected["pool"] | expected["missing"]) + len(expected["outside"])
    assert streamed.gallery_entries == len(expected["gallery"])
    assert ("val", "8:1") in expected["gallery"] and ("test", "8:1") in expected["gallery"]
    assert Image.objects.get(dataset__name="streamed", external_id="8:1").extra["txt"] == "a caption"
    assert streamed.warnings == whole.warnings
    assert "mbeir_cirr_task7_test_cand_pool.jsonl: skipped 6 text-only candidate(s) (no img_path)" in streamed.warnings
    assert (
        f"{len(expected['missing'])} target did(s) are in no candidate pool, e.g. "
        f"{sorted(expected['missing'])[0]!r}" in streamed.warnings
    )
    before = snapshot("streamed")
    assert before == snapshot("whole")
    stamp = Dataset.objects.get(name="streamed").updated_at

    again = import_files("mbeir", "streamed", paths)
    assert (again.queries, again.queries_created, again.queries_updated, again.queries_unchanged) == (40, 0, 0, 40)
    # 8:1's test-pool row lacks the caption its val-pool row adds: the re-import keeps the stored
    # caption (a sighting that knows less never blanks one), so no image is written at all
    assert (again.images, again.images_created, again.images_updated) == (streamed.images, 0, 0)
    assert again.gallery_entries == streamed.gallery_entries and again.warnings == streamed.warnings
    assert snapshot("streamed") == before
    assert Dataset.objects.get(name="streamed").updated_at > stamp


def test_a_bad_pool_line_after_written_batches_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(mbeir, "POOL_BATCH", 5)
    paths = synthetic(tmp_path, 30)
    lines = paths[1].read_text().splitlines()
    lines[22] = pool_line("8:3", "img/x.jpg")  # a duplicate did, in the fifth batch
    paths[1].write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"line 23, field 'did': duplicate did '8:3' \(first at line 4\)"):
        import_files("mbeir", "broken", paths)
    assert not Dataset.objects.filter(name="broken").exists()
    assert not Image.objects.exists() and not GalleryEntry.objects.exists()
