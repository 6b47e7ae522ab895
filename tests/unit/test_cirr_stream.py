"""CIRR split files stream: image batches go to an image sink, nothing per split-file image
(nor per pairid) stays in Python while the captions stream.

Records, warnings and errors must be those of the in-memory parse (``cirr.parse``, no sink),
which keeps every image on the ParsedDataset.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from retrieval.importers import cirr
from retrieval.records import ParsedDataset, ParseError
from tests.unit.test_mbeir_pool import Sink

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "datasets" / "cirr"
FIXTURE = sorted(DATA.glob("*.json"))


def image(n: int) -> str:
    return f"dev-{n // 8}-{(n // 2) % 4}-img{n % 2}"


def write_cirr(folder: Path, n: int, ext: bool = True, extra_split: dict[str, str] | None = None) -> list[Path]:
    """``n`` CIRR-shaped val triplets over about ``n / 2`` images, with their split file (and ext file)."""
    n_images = max(8, n // 2)
    cap, more = [], []
    for i in range(n):
        members = [image((i * 7 + k * 13) % n_images) for k in range(6)]
        cap.append(
            {
                "pairid": i,
                "reference": members[0],
                "target_hard": members[1],
                "caption": f"caption {i}",
                "target_soft": {members[1]: 1.0, members[2]: 0.5, members[3]: -1.0},
                "img_set": {"id": i // 6, "members": members, "reference_rank": 0, "target_rank": 1},
            }
        )
        more.append(
            {
                "pairid": i,
                "reference": members[0],
                "target_hard": members[1],
                "caption_extend": {str(k): f"variant {k} of {i}" for k in range(4)},
            }
        )
    split = {image(m): f"./dev/{image(m)}.png" for m in range(n_images)}
    split.update(extra_split or {})
    files = {"cap.rc2.val.json": cap, "split.rc2.val.json": split, **({"cap.ext.rc2.val.json": more} if ext else {})}
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data, indent=0), encoding="utf-8")
    return [folder / name for name in files]


def streamed(paths, monkeypatch, batch: int) -> tuple[ParsedDataset, Sink, list]:
    monkeypatch.setattr(cirr, "BATCH", batch)
    sink = Sink()
    dataset = ParsedDataset(format="cirr", image_sink=sink)
    return dataset, sink, list(cirr.stream(paths, dataset))


def test_fixture_split_files_go_to_the_sink_and_match_parse(monkeypatch):
    parsed = cirr.parse(FIXTURE)
    dataset, sink, queries = streamed(FIXTURE, monkeypatch, batch=16)
    split_ids = {s: list(json.loads((DATA / f"split.rc2.{s}.sample.json").read_text())) for s in ("val", "test1")}
    assert [m for split, *_, members in sink.batches if split == "val" for m in members] == split_ids["val"]
    assert max(len(new) for _, new, _, _ in sink.batches) == 16
    assert not set(dataset.images) & {i for ids in split_ids.values() for i in ids}  # none stays on the dataset
    assert dataset.galleries == {"val": [], "test1": []}
    assert queries == parsed.queries
    assert dataset.warnings == parsed.warnings
    replay = sink.replay("cirr")
    assert {**replay.images, **dataset.images} == parsed.images
    assert replay.galleries == parsed.galleries
    # what remains on the dataset: the test1 images no split file lists (path unknown)
    assert dataset.images and all(i.path is None for i in dataset.images.values())


def test_repeated_split_entries_across_batches_are_kept_once_with_one_warning(tmp_path, monkeypatch):
    paths = write_cirr(tmp_path, 40, ext=False)
    text = paths[1].read_text()
    # a JSON object may repeat a key: the reader yields both; listed again in a later batch and in the same one
    paths[1].write_text(
        text.rstrip().rstrip("}") + f',\n"{image(0)}": "./dev/other.png",\n"{image(3)}": "./dev/x.png"\n}}'
    )
    parsed = cirr.parse(paths)
    dataset, sink, queries = streamed(paths, monkeypatch, batch=7)
    assert queries == parsed.queries and dataset.warnings == parsed.warnings
    assert (
        f"split.rc2.val.json: 2 gallery entries are listed more than once (kept once), e.g. {image(0)!r}"
        in parsed.warnings
    )
    replay = sink.replay("cirr")
    assert replay.galleries == parsed.galleries and replay.images == parsed.images
    assert parsed.images[image(0)].path == f"dev/{image(0)}.png"  # the first path wins
    assert sum(len(new) for _, new, _, _ in sink.batches) == len(parsed.images)


def test_duplicate_pairid_in_a_later_batch_names_its_first_record(tmp_path, monkeypatch):
    paths = write_cirr(tmp_path, 30)
    cap = json.loads(paths[0].read_text())
    cap[25]["pairid"] = 3
    paths[0].write_text(json.dumps(cap))
    with pytest.raises(ParseError) as info:
        streamed(paths, monkeypatch, batch=4)
    assert (info.value.record, info.value.field) == (25, "pairid")
    assert "duplicate pairid 3 (first at record 4)" in info.value.message
    with pytest.raises(ParseError) as whole:
        cirr.parse(paths)
    assert str(whole.value) == str(info.value)


def test_duplicate_pairid_of_the_ext_file_names_its_first_record(tmp_path, monkeypatch):
    paths = write_cirr(tmp_path, 12)
    ext = json.loads(paths[2].read_text())
    ext[9]["pairid"] = 2
    paths[2].write_text(json.dumps(ext))
    with pytest.raises(ParseError, match=r"record 10, field 'pairid': duplicate pairid 2 \(first at record 3\)"):
        streamed(paths, monkeypatch, batch=5)


def test_an_earlier_bad_record_is_reported_before_a_later_broken_one(tmp_path, monkeypatch):
    """Records are validated a batch at a time, in file order: a bad record comes before a
    malformed record later in the same batch, and before a bad ext record further on."""
    paths = write_cirr(tmp_path, 20)
    cap = json.loads(paths[0].read_text())
    cap[2]["caption"] = 5
    text = json.dumps(cap)
    paths[0].write_text(text[: text.index('{"pairid": 9,')] + "{oops")  # cut short inside record 10
    with pytest.raises(ParseError) as info:
        streamed(paths, monkeypatch, batch=50)
    assert (info.value.record, info.value.field) == (2, "caption")
    cap[2]["caption"] = "fine again"
    paths[0].write_text(json.dumps(cap))
    ext = json.loads(paths[2].read_text())
    ext[15]["caption_extend"] = {"0": 1}
    paths[2].write_text(json.dumps(ext))
    cap[17]["reference"] = None
    paths[0].write_text(json.dumps(cap))
    with pytest.raises(ParseError) as info:
        streamed(paths, monkeypatch, batch=50)
    assert (Path(info.value.file).name, info.value.record) == ("cap.ext.rc2.val.json", 15)


def test_images_outside_the_split_file_keep_no_path_and_are_warned(tmp_path, monkeypatch):
    paths = write_cirr(tmp_path, 16, ext=False)
    cap = json.loads(paths[0].read_text())
    cap[5]["target_soft"]["not-in-split"] = 0.5
    paths[0].write_text(json.dumps(cap))
    parsed = cirr.parse(paths)
    dataset, _, queries = streamed(paths, monkeypatch, batch=3)
    assert queries == parsed.queries and dataset.warnings == parsed.warnings
    assert list(dataset.images) == ["not-in-split"] and dataset.images["not-in-split"].path is None
    assert (
        "cap.rc2.val.json: 1 referenced image(s) are not in the split file (path left empty), e.g. 'not-in-split'"
    ) in dataset.warnings


def _peak(paths: list[Path]) -> int:
    """Peak traced memory of streaming ``paths`` into a sink that keeps nothing."""
    dataset = ParsedDataset(format="cirr", image_sink=lambda *batch: None)
    tracemalloc.start()
    try:
        for _ in cirr.stream(paths, dataset):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_of_a_streamed_cirr_parse_does_not_grow_with_the_file(tmp_path, monkeypatch):
    """Four times the queries (and images) costs no more than a batch's worth more: what
    grows with the file (images, gallery members, pairids) lives in the scratch index."""
    monkeypatch.setattr(cirr, "BATCH", 200)
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    peaks = [_peak(write_cirr(small, 1000)), _peak(write_cirr(large, 4000))]
    # before the split file streamed (its images, gallery and pairids held in Python) it was 1.86x
    assert peaks[1] < 1.3 * peaks[0], peaks


def test_pk_set_answers_as_a_set_does():
    """The loader's bitmap of matched query pks (a re-import's ``claimed``): keys added in any
    order, lower ones after higher ones included."""
    from retrieval.loader import PkSet

    keys = [1000, 1007, 1008, 17, 5000, 999, 0, 4999]
    pks, seen = PkSet(), set()
    for key in keys:
        pks.add(key)
        seen.add(key)
        assert [k for k in range(6000) if k in pks] == sorted(seen)
    assert -1 not in pks and 10**9 not in pks
    assert len(pks.bits) == 5000 // 8 + 1  # one bit per key of the range
