"""M-BEIR candidate pools stream: batches go to an image sink, nothing per pool row stays on the dataset.

Counts, warnings and errors must be those of the in-memory parse (``mbeir.parse``), which
keeps every image on the ParsedDataset.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.importers import mbeir
from retrieval.importers.poolindex import PoolIndex
from retrieval.records import ImageRecord, ParsedDataset, ParseError

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "datasets" / "mbeir"
FIXTURE = [
    DATA / n
    for n in ("mbeir_cirr_task7_test.jsonl", "mbeir_cirr_task7_cand_pool.jsonl", "mbeir_cirr_task7_test_qrels.txt")
]


class Sink:
    """Collects what a streaming parse hands over, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[ImageRecord], list[ImageRecord], list[str]]] = []

    def __call__(self, split, new, changed, members) -> None:
        self.batches.append((split, list(new), list(changed), list(members)))

    def replay(self, fmt: str = "mbeir") -> ParsedDataset:
        """The batches applied to a dataset without a sink (what parse() keeps)."""
        out = ParsedDataset(format=fmt)
        for split, new, changed, members in self.batches:
            out.add_streamed_images(split, new, changed, members)
        return out


def streamed(paths, monkeypatch, batch: int, split: str | None = None) -> tuple[ParsedDataset, Sink, list]:
    monkeypatch.setattr(mbeir, "POOL_BATCH", batch)
    sink = Sink()
    dataset = ParsedDataset(format="mbeir", image_sink=sink)
    queries = list(mbeir.stream(paths, dataset, split=split))
    return dataset, sink, queries


def pool_line(did: str, img: str | None, **more) -> str:
    return json.dumps(
        {"txt": None, "img_path": img, "modality": "image", "did": did, "src_content": json.dumps({"id": did}), **more}
    )


def write_lines(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def query_line(qid: str, img: str | None, pos: list[str], neg: list[str] = ()) -> str:
    return json.dumps(
        {
            "qid": qid,
            "query_txt": f"text {qid}",
            "query_img_path": img,
            "query_modality": "image,text",
            "query_src_content": "{}",
            "pos_cand_list": pos,
            "neg_cand_list": list(neg),
            "task_id": 7,
        }
    )


def test_fixture_pool_goes_to_the_sink_in_batches_and_matches_parse(monkeypatch):
    parsed = mbeir.parse(FIXTURE)
    dataset, sink, queries = streamed(FIXTURE, monkeypatch, batch=3)
    pool = [json.loads(line) for line in FIXTURE[1].read_text().splitlines() if line.strip()]
    assert [len(new) for _, new, _, _ in sink.batches] == [3, 3, 2]
    assert [m for *_, members in sink.batches for m in members] == [r["did"] for r in pool]
    assert not set(dataset.images) & {r["did"] for r in pool}  # no pool image stays on the dataset
    assert dataset.galleries == {"test": []}
    assert queries == parsed.queries
    assert dataset.warnings == parsed.warnings
    replay = sink.replay()
    assert {**replay.images, **dataset.images} == parsed.images
    assert replay.galleries == parsed.galleries


def test_duplicate_did_in_a_later_batch_names_its_first_record(tmp_path, monkeypatch):
    lines = [pool_line(f"8:{n}", f"img/{n}.jpg") for n in range(5)] + [pool_line("8:1", "img/other.jpg")]
    path = write_lines(tmp_path, "mbeir_x_test_cand_pool.jsonl", lines)
    with pytest.raises(ParseError) as info:
        streamed([path], monkeypatch, batch=2)
    err = info.value
    assert (err.file, err.record, err.field) == (str(path), 5, "did")
    assert "duplicate did '8:1' (first at line 2)" in err.message
    with pytest.raises(ParseError) as info:
        mbeir.parse([path])
    assert str(info.value) == str(err)


def test_an_earlier_bad_line_is_reported_before_a_later_duplicate(tmp_path, monkeypatch):
    lines = [pool_line("8:0", "img/0.jpg"), pool_line("8:1", "/abs.jpg"), pool_line("8:0", "img/2.jpg")]
    path = write_lines(tmp_path, "mbeir_x_test_cand_pool.jsonl", lines)
    with pytest.raises(ParseError) as info:
        streamed([path], monkeypatch, batch=10)
    assert (info.value.record, info.value.field) == (1, "img_path")


def test_overlapping_pools_text_only_rows_and_missing_targets(tmp_path, monkeypatch):
    """Two pools of one split share dids (kept once in the gallery, no error); a did repeated
    in the val pool gains an extra key (sent as changed); text-only rows and targets in no pool
    are warned as before."""
    first = write_lines(
        tmp_path,
        "mbeir_a_test_cand_pool.jsonl",
        [
            pool_line("8:1", "img/1.jpg"),
            pool_line("8:2", None, txt="words"),
            pool_line("8:3", "img/3.jpg"),
            pool_line("8:4", "img/4.jpg"),
        ],
    )
    second = write_lines(
        tmp_path,
        "mbeir_b_test_cand_pool.jsonl",
        [pool_line("8:3", "img/3.jpg"), pool_line("8:5", "img/5.jpg"), pool_line("8:1", "img/1.jpg")],
    )
    val = write_lines(tmp_path, "mbeir_c_val_cand_pool.jsonl", [pool_line("8:4", "img/4.jpg", txt="a caption")])
    queries = write_lines(
        tmp_path,
        "mbeir_a_test.jsonl",
        [
            query_line("q1", "img/3.jpg", ["8:5"], ["8:2"]),
            query_line("q2", "img/9.jpg", ["8:7", "8:1"]),
        ],
    )
    paths = [queries, first, second, val]
    parsed = mbeir.parse(paths)
    dataset, sink, streamed_queries = streamed(paths, monkeypatch, batch=2)
    assert streamed_queries == parsed.queries
    assert (
        dataset.warnings
        == parsed.warnings
        == [
            "mbeir_a_test_cand_pool.jsonl: skipped 1 text-only candidate(s) (no img_path)",
            "2 target did(s) are in no candidate pool, e.g. '8:2'",
        ]
    )
    assert parsed.galleries == {"test": ["8:1", "8:3", "8:4", "8:5"], "val": ["8:4"]}
    replay = sink.replay()
    assert replay.galleries == parsed.galleries
    assert {**replay.images, **dataset.images} == parsed.images
    assert parsed.images["8:4"].extra["txt"] == "a caption"
    changed = [image for _, _, batch, _ in sink.batches for image in batch]
    assert [(i.external_id, i.extra.get("txt")) for i in changed] == [("8:4", "a caption")]
    assert sorted(dataset.images) == ["8:2", "8:7", "img/9.jpg"]  # only what no pool registered
    q1 = streamed_queries[0]
    assert q1.turns[0].reference == "8:3" and [t.image for t in q1.targets] == ["8:5", "8:2"]


def test_pool_index_answers_from_disk():
    with PoolIndex() as index:
        index.start_file()
        index.mark_seen([("a", 0), ("b", 1), ("a", 7)])
        assert index.first_lines(["a", "c"]) == {"a": 0}
        index.store([ImageRecord("a", path="x/a.jpg", extra={"k": 1})], [])
        index.add_paths([("x/a.jpg", "a"), ("x/a.jpg", "z")])
        assert index.did_for_path("x/a.jpg") == "a" and index.did_for_path("nope") is None
        assert index.has("a") and not index.has("b")
        assert index.images(["a", "b"]) == {"a": ImageRecord("a", path="x/a.jpg", extra={"k": 1})}
        assert index.add_members("test", ["a", "b", "a"]) == ["a", "b"]
        assert index.add_members("test", ["b", "c"]) == ["c"] and index.add_members("val", ["b"]) == ["b"]
        index.start_file()
        assert index.first_lines(["a"]) == {}
