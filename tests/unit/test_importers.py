"""Tests for the pure annotation parsers in retrieval.importers.

Counts are checked against the fixture files read independently with ``json``; mapping
details against hand-checked records of the real samples (see
tests/fixtures/datasets/README.md for where every file comes from).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval import importers
from retrieval.importers import circled, circo, cirr, fashioniq, lasco, mbeir, mtfiq
from retrieval.records import ParsedDataset, ParseError

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"


def load(*parts: str):
    return json.loads((DATA.joinpath(*parts)).read_text(encoding="utf-8"))


def write(tmp_path: Path, name: str, content) -> Path:
    """Write ``content`` (str verbatim, anything else as JSON) to ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def raises(fn, *args, **kwargs) -> ParseError:
    with pytest.raises(ParseError) as info:
        fn(*args, **kwargs)
    return info.value


def by_id(ds: ParsedDataset) -> dict:
    return {q.external_id: q for q in ds.queries}


# --------------------------------------------------------------------------- registry


def test_formats_registry_has_the_seven_parsers():
    assert set(importers.FORMATS) == {"cirr", "fashioniq", "circo", "lasco", "mbeir", "circled", "mtfiq"}
    for key, module in importers.FORMATS.items():
        assert callable(module.parse)
        assert module.FORMAT == key


def test_dispatch_and_unknown_format():
    ds = importers.parse("circo", [DATA / "circo" / "val.json"])
    assert ds.format == "circo" and len(ds.queries) == 220
    with pytest.raises(ValueError):
        importers.parse("nope", [DATA / "circo" / "val.json"])


@pytest.mark.parametrize("module", [cirr, fashioniq, circo, lasco, mbeir, circled, mtfiq])
def test_unknown_file_name_names_the_file(tmp_path, module):
    path = write(tmp_path, "something_else.csv", "x")
    err = raises(module.parse, [path])
    assert err.file == str(path)
    assert err.record is None and err.field is None


def test_missing_file_is_a_parse_error(tmp_path):
    path = tmp_path / "val.json"
    err = raises(circo.parse, [path])
    assert err.file == str(path)


# --------------------------------------------------------------------------- CIRR

CIRR_FILES = [
    DATA / "cirr" / name
    for name in (
        "cap.rc2.val.sample.json",
        "cap.ext.rc2.val.sample.json",
        "split.rc2.val.sample.json",
        "cap.rc2.test1.sample.json",
        "split.rc2.test1.sample.json",
    )
]


@pytest.fixture(scope="module")
def cirr_ds() -> ParsedDataset:
    return cirr.parse(CIRR_FILES)


def test_cirr_counts_and_ids(cirr_ds):
    val = load("cirr", "cap.rc2.val.sample.json")
    test1 = load("cirr", "cap.rc2.test1.sample.json")
    assert cirr_ds.format == "cirr"
    assert len(cirr_ds.queries) == len(val) + len(test1)
    vq = [q for q in cirr_ds.queries if q.split == "val"]
    assert [q.external_id for q in vq] == [str(r["pairid"]) for r in val]
    assert [q.ordinal for q in vq] == list(range(len(val)))
    assert all(q.raw == r for q, r in zip(vq, val))
    assert all(q.source_file == "cap.rc2.val.sample.json" for q in vq)
    assert cirr_ds.galleries["val"] == list(load("cirr", "split.rc2.val.sample.json"))
    assert cirr_ds.galleries["test1"] == list(load("cirr", "split.rc2.test1.sample.json"))


def test_cirr_hard_target_only(cirr_ds):
    q = by_id(cirr_ds)["12060"]
    assert q.turns[0].reference == "dev-244-0-img0"
    assert q.turns[0].texts[0].text == "show three bottles of soft drink"
    assert [(t.image, t.relevance, t.is_primary, t.role) for t in q.targets] == [("dev-1028-1-img1", 1.0, True, "hard")]


def test_cirr_soft_negative_kept(cirr_ds):
    q = by_id(cirr_ds)["12062"]
    assert [(t.image, t.relevance, t.is_primary, t.role, t.source_field) for t in q.targets] == [
        ("dev-430-3-img0", 1.0, True, "hard", "target_hard"),
        ("dev-1028-1-img1", -1.0, False, "soft", "target_soft"),
    ]


def test_cirr_hard_not_in_soft(cirr_ds):
    # pairid 12130: target_hard dev-115-1-img0 is not a target_soft key; the reference
    # dev-189-3-img0 is scored 1.0 in target_soft (the misaligned-labels quirk).
    q = by_id(cirr_ds)["12130"]
    assert [(t.image, t.relevance, t.is_primary, t.role) for t in q.targets] == [
        ("dev-115-1-img0", 1.0, True, "hard"),
        ("dev-115-3-img1", 1.0, False, "soft"),
        ("dev-189-3-img0", 1.0, False, "soft"),
        ("dev-748-0-img0", -1.0, False, "soft"),
    ]


def test_cirr_reference_scored_positive_is_flagged(cirr_ds):
    val = load("cirr", "cap.rc2.val.sample.json")
    flagged = [r for r in val if r["target_soft"].get(r["reference"], 0) > 0]
    assert len(flagged) == 3  # pairids 12130, 12155, 27067 (hand-checked in the file)
    assert any(f"{len(flagged)} quer(y/ies) list the reference" in w for w in cirr_ds.warnings)


def test_cirr_hard_relevance_from_soft(cirr_ds):
    q = by_id(cirr_ds)["14671"]
    assert [(t.image, t.relevance, t.role) for t in q.targets] == [
        ("dev-474-1-img1", 0.2, "hard"),
        ("dev-192-2-img0", 0.5, "soft"),
    ]
    q = by_id(cirr_ds)["29045"]
    assert [(t.image, t.relevance, t.is_primary) for t in q.targets] == [("dev-227-3-img1", -1.0, True)]


def test_cirr_one_primary_and_test_has_no_targets(cirr_ds):
    for q in cirr_ds.queries:
        if q.split == "val":
            assert sum(t.is_primary for t in q.targets) == 1
            assert q.targets[0].image == q.raw["target_hard"]
        else:
            assert q.split == "test1" and q.targets == []


def test_cirr_caption_ext(cirr_ds):
    ext = load("cirr", "cap.ext.rc2.val.sample.json")
    q = by_id(cirr_ds)["12060"]
    assert [(t.text, t.role, t.key) for t in q.turns[0].texts] == [
        ("show three bottles of soft drink", "caption", None),
        ("being a photo of bottles", "caption_ext", "0"),
        ("change the size of the bottles", "caption_ext", "1"),
        ("[cr1] Covered in query", "caption_ext", "2"),
        ("add a pub in the background", "caption_ext", "3"),
    ]
    with_ext = [q for q in cirr_ds.queries if any(t.role == "caption_ext" for t in q.turns[0].texts)]
    assert sorted(q.external_id for q in with_ext) == sorted(str(r["pairid"]) for r in ext)
    assert all(len(q.turns[0].texts) == 5 for q in with_ext)


def test_cirr_image_paths_and_img_set(cirr_ds):
    assert cirr_ds.images["dev-244-0-img0"].path == "dev/dev-244-0-img0.png"
    split = load("cirr", "split.rc2.test1.sample.json")
    absent = [r["reference"] for r in load("cirr", "cap.rc2.test1.sample.json") if r["reference"] not in split]
    assert absent  # the test1 excerpt lists only 20 images
    assert all(cirr_ds.images[i].path is None for i in absent)
    assert any("not in the split file" in w for w in cirr_ds.warnings)
    q = by_id(cirr_ds)["12060"]
    assert q.extra["img_set"] == q.raw["img_set"]
    assert q.extra["img_set"]["members"][0] == "dev-430-3-img0"


def test_cirr_split_override():
    ds = cirr.parse([CIRR_FILES[0], CIRR_FILES[2]], split="dev")
    assert {q.split for q in ds.queries} == {"dev"}
    assert list(ds.galleries) == ["dev"]


CIRR_OK = {
    "pairid": 1,
    "reference": "dev-1-0-img0",
    "target_hard": "dev-2-0-img0",
    "target_soft": {"dev-2-0-img0": 1.0},
    "caption": "x",
    "img_set": {"id": 1, "members": ["dev-1-0-img0"], "reference_rank": 0, "target_rank": 1},
}


def test_cirr_bad_json(tmp_path):
    path = write(tmp_path, "cap.rc2.val.json", '[\n{"pairid": 1,\n')
    err = raises(cirr.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 0, None)
    assert "ends inside this record" in err.message and "no record is complete" in err.message


@pytest.mark.parametrize(
    "change, field",
    [
        ({"caption": None}, "caption"),  # missing (removed below)
        ({"pairid": "1"}, "pairid"),  # wrong type
        ({"caption": 5}, "caption"),
        ({"target_hard": None}, "target_hard"),  # missing in a val split
        ({"target_soft": {"dev-2-0-img0": "high"}}, "target_soft"),
        ({"img_set": {"id": 1, "members": "dev-1"}}, "img_set.members"),
    ],
)
def test_cirr_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**CIRR_OK, "pairid": 2, **change}.items() if v is not None}
    path = write(tmp_path, "cap.rc2.val.json", [CIRR_OK, bad])
    err = raises(cirr.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


@pytest.mark.parametrize("bad_path", ["../dev/b.png", "./dev/../../b.png", "/abs/dev/b.png"])
def test_cirr_bad_image_path(tmp_path, bad_path):
    path = write(tmp_path, "split.rc2.val.json", {"a": "./dev/a.png", "b": bad_path})
    err = raises(cirr.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, "b")


def test_cirr_duplicate_pairid(tmp_path):
    path = write(tmp_path, "cap.rc2.val.json", [CIRR_OK, CIRR_OK])
    err = raises(cirr.parse, [path])
    assert (err.record, err.field) == (1, "pairid")


# --------------------------------------------------------------------------- FashionIQ

FIQ_FILES = sorted((DATA / "fashioniq").glob("*.json"))


@pytest.fixture(scope="module")
def fiq_ds() -> ParsedDataset:
    return fashioniq.parse(FIQ_FILES)


def test_fiq_counts_and_ids(fiq_ds):
    for cat in ("dress", "shirt", "toptee"):
        records = load("fashioniq", f"cap.{cat}.val.sample.json")
        qs = [q for q in fiq_ds.queries if q.category == cat and q.split == "val"]
        assert len(qs) == len(records)
        assert [q.external_id for q in qs] == [f"{cat}/val/{i:05d}" for i in range(len(records))]
        assert [q.raw for q in qs] == records
        assert fiq_ds.galleries[f"{cat}/val"] == load("fashioniq", f"split.{cat}.val.sample.json")
        assert all(q.extra["gallery"] == f"{cat}/val" for q in qs)
    assert fiq_ds.galleries["dress/test"] == load("fashioniq", "split.dress.test.sample.json")


def test_fiq_mapping(fiq_ds):
    q = by_id(fiq_ds)["dress/val/00000"]
    assert q.turns[0].reference == "B005X4PL1G"
    assert [(t.text, t.annotator) for t in q.turns[0].texts] == [
        ("is shiny and silver with shorter sleeves", 0),
        ("fit and flare", 1),
    ]
    assert [(t.image, t.is_primary, t.role) for t in q.targets] == [("B0084Y8XIU", True, "gt")]
    assert fiq_ds.images["B0084Y8XIU"].path == "B0084Y8XIU.jpg"
    assert q.category == "dress"


def test_fiq_captions_verbatim(fiq_ds):
    shirt = load("fashioniq", "cap.shirt.val.sample.json")
    index = next(i for i, r in enumerate(shirt) if "" in r["captions"])
    q = by_id(fiq_ds)[f"shirt/val/{index:05d}"]
    assert [t.text for t in q.turns[0].texts] == ["", "is grey with a design on the back"]
    test = by_id(fiq_ds)["dress/test/00000"]
    assert test.turns[0].texts[0].text == " yello and more flowing"  # leading space kept
    assert all(q.targets == [] for q in fiq_ds.queries if q.split == "test")
    assert len([q for q in fiq_ds.queries if q.split == "test"]) == len(load("fashioniq", "cap.dress.test.sample.json"))


FIQ_OK = {"target": "B0084Y8XIU", "candidate": "B005X4PL1G", "captions": ["a", "b"]}


def test_fiq_bad_json(tmp_path):
    path = write(tmp_path, "cap.dress.val.json", '[{"target": "B1", ]')
    err = raises(fashioniq.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 0, None)
    assert "invalid JSON" in err.message


@pytest.mark.parametrize(
    "change, field",
    [
        ({"candidate": None}, "candidate"),
        ({"target": None}, "target"),
        ({"captions": ["a", 1]}, "captions"),
        ({"captions": "a and b"}, "captions"),
        ({"target": 123}, "target"),
        ({"candidate": "../B005X4PL1G"}, "candidate"),
        ({"candidate": "/etc/B005X4PL1G"}, "candidate"),
    ],
)
def test_fiq_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**FIQ_OK, **change}.items() if v is not None}
    path = write(tmp_path, "cap.dress.val.json", [FIQ_OK, FIQ_OK, bad])
    err = raises(fashioniq.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 2, field)


def test_fiq_bad_split_entry(tmp_path):
    path = write(tmp_path, "split.dress.val.json", ["B1", 7])
    err = raises(fashioniq.parse, [path])
    assert (err.file, err.record) == (str(path), 1)


# --------------------------------------------------------------------------- CIRCO


@pytest.fixture(scope="module")
def circo_ds() -> ParsedDataset:
    return circo.parse([DATA / "circo" / "val.json", DATA / "circo" / "test.sample.json"])


def test_circo_counts(circo_ds):
    val = load("circo", "val.json")
    vq = [q for q in circo_ds.queries if q.split == "val"]
    assert len(vq) == len(val) == 220
    counts = [len(q.targets) for q in vq]
    assert min(counts) == 1 and max(counts) == 14
    total = sum(len(r["gt_img_ids"]) for r in val)
    assert sum(counts) == total == 916
    assert round(total / 220, 2) == 4.16  # published val average
    test = [q for q in circo_ds.queries if q.split == "test"]
    assert len(test) == len(load("circo", "test.sample.json"))
    assert all(q.targets == [] for q in test)


def test_circo_mapping(circo_ds):
    val = load("circo", "val.json")
    vq = [q for q in circo_ds.queries if q.split == "val"]
    for q, r in zip(vq, val):
        assert q.external_id == str(r["id"])
        assert [t.image for t in q.targets] == [str(i) for i in r["gt_img_ids"]]
        primaries = [t.image for t in q.targets if t.is_primary]
        assert primaries == [str(r["target_img_id"])] and q.targets[0].is_primary
        assert q.context_text == r["shared_concept"] and q.tags == r["semantic_aspects"]
        assert q.raw == r
    q = vq[0]
    assert q.turns[0].reference == "271520"
    assert q.turns[0].texts[0].text == "shows two people and has a more colorful background"
    assert circo_ds.images["355099"].path == "000000355099.jpg"
    assert circo_ds.galleries == {}


def test_circo_bad_json(tmp_path):
    path = write(tmp_path, "val.json", f"[{json.dumps(CIRCO_OK)}\n{json.dumps({**CIRCO_OK, 'id': 1})}]")
    err = raises(circo.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, None)
    assert "record 1 is the last complete one" in err.message and str(err).startswith(f"{path}, record 2:")  # 1-based


CIRCO_OK = {
    "reference_img_id": 1,
    "target_img_id": 2,
    "relative_caption": "x",
    "shared_concept": "y",
    "gt_img_ids": [2, 3],
    "id": 0,
    "semantic_aspects": ["addition"],
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"relative_caption": None}, "relative_caption"),
        ({"gt_img_ids": None}, "gt_img_ids"),
        ({"gt_img_ids": ["2", "3"]}, "gt_img_ids"),
        ({"gt_img_ids": [2.0]}, "gt_img_ids"),
        ({"gt_img_ids": []}, "gt_img_ids"),
        ({"id": "0"}, "id"),
        ({"reference_img_id": "../000000000001.jpg"}, "reference_img_id"),
        ({"reference_img_id": -5}, "reference_img_id"),
        ({"semantic_aspects": "addition"}, "semantic_aspects"),
    ],
)
def test_circo_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**CIRCO_OK, **change, "id": change.get("id", 1)}.items() if v is not None}
    path = write(tmp_path, "val.json", [CIRCO_OK, bad])
    err = raises(circo.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


# --------------------------------------------------------------------------- LaSCo


@pytest.fixture(scope="module")
def lasco_ds() -> ParsedDataset:
    return lasco.parse([DATA / "lasco" / "lasco_val.json", DATA / "lasco" / "lasco_val_corpus.sample.json"])


def test_lasco_counts_and_mapping(lasco_ds):
    triplets = load("lasco", "lasco_val.json")
    corpus = load("lasco", "lasco_val_corpus.sample.json")
    assert len(lasco_ds.queries) == len(triplets)
    assert lasco_ds.galleries["val"] == [str(r["id"]) for r in corpus]
    q = by_id(lasco_ds)["42000"]
    assert q.turns[0].reference == "42"
    assert q.turns[0].texts[0].text == "The dog is sleeping on the sofa"
    assert [(t.image, t.is_primary) for t in q.targets] == [("73", True)]
    assert q.raw == triplets[0] and q.extra["gallery"] == "val"


def test_lasco_corpus_path_reconciled(lasco_ds):
    image = lasco_ds.images["42"]
    assert image.path == "val2014/COCO_val2014_000000000042.jpg"  # same as the triplet path
    assert image.extra["corpus_path"] == "val/val2014/COCO_val2014_000000000042.jpg"
    assert lasco_ds.images["590"].path == "val2014/COCO_val2014_000000000590.jpg"  # corpus only
    assert lasco_ds.images["277005"].path == "val2014/COCO_val2014_000000277005.jpg"  # triplet only
    assert not lasco_ds.warnings
    assert lasco.reconcile_corpus_path("train/train2014/a.jpg") == "train2014/a.jpg"
    assert lasco.reconcile_corpus_path("val/other/a.jpg") == "val/other/a.jpg"
    assert lasco.reconcile_corpus_path("val2014/a.jpg") == "val2014/a.jpg"


def test_lasco_corpus_split(tmp_path):
    corpus = write(tmp_path, "my_corpus.json", [{"id": 1, "path": "val/val2014/a.jpg"}])
    assert lasco.parse([corpus], split="val").galleries == {"val": ["1"]}
    err = raises(lasco.parse, [corpus])
    assert err.file == str(corpus)


LASCO_OK = {"qid": 1, "query-image": [1, "val2014/a.jpg"], "query-text": "x", "target-image": [2, "val2014/b.jpg"]}


def test_lasco_bad_json(tmp_path):
    path = write(tmp_path, "lasco_val.json", '[{"qid": 1, "query-text": "x"')
    err = raises(lasco.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 0, None)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"query-text": None}, "query-text"),
        ({"target-image": None}, "target-image"),
        ({"query-image": ["1", "val2014/a.jpg"]}, "query-image"),
        ({"query-image": [1]}, "query-image"),
        ({"qid": 1.5}, "qid"),
        ({"target-image": [2, "../val2014/b.jpg"]}, "target-image"),
        ({"query-image": [1, "/data/val2014/a.jpg"]}, "query-image"),
    ],
)
def test_lasco_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**LASCO_OK, "qid": 2, **change}.items() if v is not None}
    path = write(tmp_path, "lasco_val.json", [LASCO_OK, bad])
    err = raises(lasco.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


@pytest.mark.parametrize("bad_path", ["../val2014/c.jpg", "/val2014/c.jpg"])
def test_lasco_bad_corpus_path(tmp_path, bad_path):
    rows = [{"id": 1, "path": "val/val2014/a.jpg"}, {"id": 3, "path": bad_path}]
    path = write(tmp_path, "lasco_val_corpus.json", rows)
    err = raises(lasco.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, "path")


# --------------------------------------------------------------------------- M-BEIR

MBEIR_FILES = [
    DATA / "mbeir" / n
    for n in ("mbeir_cirr_task7_test.jsonl", "mbeir_cirr_task7_cand_pool.jsonl", "mbeir_cirr_task7_test_qrels.txt")
]


@pytest.fixture(scope="module")
def mbeir_ds() -> ParsedDataset:
    return mbeir.parse(MBEIR_FILES)


def jsonl(*parts: str) -> list:
    return [json.loads(line) for line in DATA.joinpath(*parts).read_text().splitlines() if line.strip()]


def test_mbeir_counts(mbeir_ds):
    queries = jsonl("mbeir", "mbeir_cirr_task7_test.jsonl")
    pool = jsonl("mbeir", "mbeir_cirr_task7_cand_pool.jsonl")
    assert [q.external_id for q in mbeir_ds.queries] == [r["qid"] for r in queries]
    assert [q.raw for q in mbeir_ds.queries] == queries
    assert {q.split for q in mbeir_ds.queries} == {"test"}
    assert mbeir_ds.galleries["test"] == [r["did"] for r in pool]
    for row in pool:
        image = mbeir_ds.images[row["did"]]
        assert image.path == row["img_path"] and image.extra["src_content"] == row["src_content"]


def test_mbeir_mapping(mbeir_ds):
    q = by_id(mbeir_ds)["8:2"]
    assert q.turns[0].reference == "8:4"  # query image found in the pool by path
    assert [t.text for t in q.turns[0].texts] == ["Fewer paper towels per pack"]
    assert [(t.image, t.relevance, t.is_primary, t.role) for t in q.targets] == [
        ("8:3", 1.0, True, "pos"),
        ("8:2", 0.0, False, "neg"),
    ]  # qrels rel 0 line ignored
    assert q.extra["task_id"] == 7 and q.extra["gallery"] == "test"


def test_mbeir_qrels_add_positives(mbeir_ds):
    q = by_id(mbeir_ds)["8:3"]
    assert [(t.image, t.role, t.source_field, t.is_primary) for t in q.targets] == [
        ("8:5", "pos", "pos_cand_list", True),
        ("8:6", "pos", "pos_cand_list", False),
        ("8:7", "neg", "neg_cand_list", False),
        ("8:8", "pos", "qrels", False),
    ]


def test_mbeir_query_image_outside_pool(mbeir_ds):
    q = by_id(mbeir_ds)["8:4"]
    rel = "mbeir_images/cirr_images/dev/dev-1042-0-img0.jpg"
    assert q.turns[0].reference == rel and mbeir_ds.images[rel].path == rel
    assert mbeir_ds.images["8:9"].path is None
    assert any("8:9" in w for w in mbeir_ds.warnings)


def test_mbeir_split_from_argument(tmp_path):
    path = write(
        tmp_path,
        "queries.jsonl",
        json.dumps({"qid": "8:1", "query_txt": "x", "query_img_path": None, "pos_cand_list": ["8:2"]}) + "\n",
    )
    err = raises(mbeir.parse, [path])
    assert err.file == str(path)
    ds = mbeir.parse([path], split="val")
    assert ds.queries[0].split == "val" and ds.queries[0].turns[0].reference is None


MBEIR_OK = {
    "qid": "8:1",
    "query_txt": "x",
    "query_img_path": "mbeir_images/cirr_images/dev/a.jpg",
    "query_modality": "image,text",
    "query_src_content": "{}",
    "pos_cand_list": ["8:2"],
    "neg_cand_list": [],
    "task_id": 7,
}


def test_mbeir_bad_json_line(tmp_path):
    path = write(tmp_path, "mbeir_cirr_task7_test.jsonl", json.dumps(MBEIR_OK) + '\n{"qid": "8:2",\n')
    err = raises(mbeir.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, None)
    assert str(err).startswith(f"{path}, line 2:")  # JSON Lines: the line number


@pytest.mark.parametrize(
    "change, field",
    [
        ({"qid": None}, "qid"),
        ({"pos_cand_list": None}, "pos_cand_list"),
        ({"qid": 2}, "qid"),
        ({"pos_cand_list": "8:2"}, "pos_cand_list"),
        ({"query_txt": 3}, "query_txt"),
        ({"query_img_path": "../cirr_images/a.jpg"}, "query_img_path"),
        ({"query_img_path": "/mbeir_images/a.jpg"}, "query_img_path"),
    ],
)
def test_mbeir_bad_query(tmp_path, change, field):
    bad = {k: v for k, v in {**MBEIR_OK, "qid": "8:2", **change}.items() if not (v is None and k in change)}
    path = write(tmp_path, "mbeir_cirr_task7_test.jsonl", json.dumps(MBEIR_OK) + "\n" + json.dumps(bad) + "\n")
    err = raises(mbeir.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


@pytest.mark.parametrize("img_path", ["/abs/x.jpg", "mbeir_images/../../x.jpg"])
def test_mbeir_bad_pool_path(tmp_path, img_path):
    rows = [
        {"did": "8:1", "img_path": "mbeir_images/a.jpg", "modality": "image", "txt": None, "src_content": None},
        {"did": "8:2", "img_path": img_path, "modality": "image", "txt": None, "src_content": None},
    ]
    path = write(tmp_path, "mbeir_cirr_task7_cand_pool.jsonl", "\n".join(json.dumps(r) for r in rows))
    err = raises(mbeir.parse, [path], split="test")
    assert (err.file, err.record, err.field) == (str(path), 1, "img_path")


def test_mbeir_bad_qrels(tmp_path):
    queries = write(tmp_path, "mbeir_cirr_task7_test.jsonl", json.dumps(MBEIR_OK))
    qrels = write(tmp_path, "mbeir_cirr_task7_test_qrels.txt", "8:1 0 8:2 1 7\n8:1 0 8:3\n")
    err = raises(mbeir.parse, [queries, qrels])
    assert (err.file, err.record) == (str(qrels), 1)
    qrels = write(tmp_path, "mbeir_cirr_task7_test_qrels.txt", "8:1 0 8:2 yes 7\n")
    err = raises(mbeir.parse, [queries, qrels])
    assert (err.file, err.record, err.field) == (str(qrels), 0, "relevance")


# --------------------------------------------------------------------------- CIRCLED

CIRCLED_FILES = sorted((DATA / "circled").glob("*.json"))


@pytest.fixture(scope="module")
def circled_ds() -> ParsedDataset:
    return circled.parse(CIRCLED_FILES)


def test_circled_counts(circled_ds):
    for path in CIRCLED_FILES:
        sessions = json.loads(path.read_text())
        qs = [q for q in circled_ds.queries if q.source_file == path.name]
        assert [q.external_id for q in qs] == [s["session_id"] for s in sessions]
        assert [len(q.turns) for q in qs] == [s["num_turns"] for s in sessions]
        assert all(q.category == path.stem and q.split == "val" for q in qs)
        assert [q.raw for q in qs] == sessions


def test_circled_turns(circled_ds):
    q = by_id(circled_ds)["cirr_val_0000"]
    assert [t.index for t in q.turns] == [1, 2, 3]
    assert [t.reference for t in q.turns] == ["dev-244-0-img0", "dev-1028-2-img1", "dev-430-3-img0"]
    assert [t.turn_target for t in q.turns] == ["dev-1028-2-img1", "dev-430-3-img0", None]
    assert [t.provenance for t in q.turns] == ["human", "llm", "llm"]
    assert q.turns[0].texts[0].text == "show three bottles of soft drink"
    assert [(t.image, t.is_primary) for t in q.targets] == [("dev-1028-1-img1", True)]
    assert circled_ds.images["dev-244-0-img0"].path == "dev/dev-244-0-img0.png"
    assert circled_ds.images["B005X4PL1G"].path == "B005X4PL1G.jpg"


def test_circled_circo_ids_match_circo_parser(circled_ds, circo_ds):
    q = by_id(circled_ds)["circo_val_0000"]
    assert [t.image for t in q.targets] == ["355099", "528417", "534704"]
    assert [t.is_primary for t in q.targets] == [True, False, False]
    assert q.turns[0].reference == "271520"
    for image_id in ("355099", "528417", "534704", "271520"):
        assert circled_ds.images[image_id].path == circo_ds.images[image_id].path
    assert circled_ds.images["534704"].extra["source_id"] == "000000534704.jpg"


def test_circled_cirr_train_has_no_path(tmp_path):
    session = {
        "session_id": "cirr_train_0000",
        "subset": "cirr_train",
        "ground_truth_ids": ["train-1-0-img0"],
        "num_turns": 1,
        "turns": [{"turn": 1, "reference_image_id": "train-2-0-img1", "relative_caption": "x"}],
    }
    ds = circled.parse([write(tmp_path, "cirr_train.json", [session])])
    assert ds.images["train-1-0-img0"].path is None and ds.warnings


CIRCLED_OK = {
    "session_id": "fashioniq_dress_val_0000",
    "subset": "fashioniq_dress_val",
    "ground_truth_ids": ["B1"],
    "num_turns": 2,
    "turns": [
        {"turn": 1, "reference_image_id": "B2", "relative_caption": "a"},
        {"turn": 2, "reference_image_id": "B3", "relative_caption": "b"},
    ],
}


def test_circled_bad_json(tmp_path):
    path = write(tmp_path, "fashioniq_dress_val.json", f"[{json.dumps(CIRCLED_OK)}}}")
    err = raises(circled.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, None)


def _turns(**second):
    return [CIRCLED_OK["turns"][0], {**CIRCLED_OK["turns"][1], **second}]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"session_id": None}, "session_id"),
        ({"ground_truth_ids": "B1"}, "ground_truth_ids"),
        ({"turns": _turns(relative_caption=7)}, "turns[1].relative_caption"),
        ({"turns": [CIRCLED_OK["turns"][0], {"turn": 2, "relative_caption": "b"}]}, "turns[1].reference_image_id"),
        ({"turns": _turns(turn=3)}, "turns[1].turn"),
        ({"turns": _turns(reference_image_id="../B3")}, "turns[1].reference_image_id"),
        ({"ground_truth_ids": ["/data/B1"]}, "ground_truth_ids"),
        ({"num_turns": 3}, "num_turns"),
        ({"subset": "fashioniq_shirt_val"}, "subset"),
    ],
)
def test_circled_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**CIRCLED_OK, "session_id": "s1", **change}.items() if v is not None}
    path = write(tmp_path, "fashioniq_dress_val.json", [CIRCLED_OK, bad])
    err = raises(circled.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


# --------------------------------------------------------------------------- Multi-turn FashionIQ

MTFIQ_FILES = sorted((DATA / "mtfiq").glob("*.json"))


@pytest.fixture(scope="module")
def mtfiq_ds() -> ParsedDataset:
    return mtfiq.parse(MTFIQ_FILES)


def test_mtfiq_counts(mtfiq_ds):
    for cat in ("dress", "shirt"):
        sessions = load("mtfiq", f"{cat}.val.sample.json")
        qs = [q for q in mtfiq_ds.queries if q.category == cat]
        assert [q.external_id for q in qs] == [f"{cat}/val/{i:05d}" for i in range(len(sessions))]
        assert [len(q.turns) for q in qs] == [len(s["reference"]) for s in sessions]
        assert [q.raw for q in qs] == sessions
    assert mtfiq_ds.galleries == {"dress/val": load("mtfiq", "split.dress.val.sample.json")}
    assert all(q.extra.get("gallery") == ("dress/val" if q.category == "dress" else None) for q in mtfiq_ds.queries)


def test_mtfiq_turn_target_chain(mtfiq_ds):
    sessions = load("mtfiq", "dress.val.sample.json")
    for q, s in zip([q for q in mtfiq_ds.queries if q.category == "dress"], sessions):
        chain = [r[2] for r in s["reference"]] + [s["target"][1]]
        assert [t.reference for t in q.turns] == chain[:-1]
        assert [t.turn_target for t in q.turns] == chain[1:]
        assert [[(x.text, x.annotator) for x in t.texts] for t in q.turns] == [
            [(c, i) for i, c in enumerate(r[1])] for r in s["reference"]
        ]
        assert [(t.image, t.is_primary) for t in q.targets] == [(s["target"][1], True)]
    first = by_id(mtfiq_ds)["dress/val/00000"]
    assert [t.turn_target for t in first.turns] == ["B009OCO9XO", "B008VPNQCK"]
    assert first.turns[1].texts[1].text == " is belted and is navy blue"
    image = mtfiq_ds.images["B0090KHN7E"]
    assert image.url == "http://ecx.images-amazon.com/images/I/41y6igcEvTL._SX342_.jpg"
    assert image.path == "B0090KHN7E.jpg"


def test_mtfiq_attributes(mtfiq_ds):
    attrs = load("mtfiq", "asin2attr.dress.val.sample.json")
    for asin, groups in attrs.items():
        assert mtfiq_ds.images[asin].extra["attributes"] == groups
    expected = [["top", "skirt", "dress"], [], ["wash"], ["sheath"], [], []]  # first line of the file
    assert mtfiq_ds.images["B005X4PL1G"].extra["attributes"] == expected


MTFIQ_OK = {
    "target": ["http://x/t.jpg", "B1"],
    "reference": [["http://x/a.jpg", ["a", "b"], "B2"], ["http://x/b.jpg", ["c", "d"], "B3"]],
}


def test_mtfiq_bad_json(tmp_path):
    path = write(tmp_path, "dress.val.json", '[{"target": ["u", "B1"], "reference": [}]')
    err = raises(mtfiq.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 0, "reference[0]")  # where a value was expected


@pytest.mark.parametrize(
    "change, field",
    [
        ({"target": None}, "target"),
        ({"reference": None}, "reference"),
        ({"target": "B1"}, "target"),
        ({"reference": [["http://x/a.jpg", "a and b", "B2"]]}, "reference[0][1]"),
        ({"reference": [["http://x/a.jpg", ["a", "b"], 2]]}, "reference[0][2]"),
        ({"reference": [["http://x/a.jpg", ["a", "b"], "../B2"]]}, "reference[0][2]"),
        ({"target": ["http://x/t.jpg", "/images/B1"]}, "target[1]"),
    ],
)
def test_mtfiq_bad_record(tmp_path, change, field):
    bad = {k: v for k, v in {**MTFIQ_OK, **change}.items() if v is not None}
    path = write(tmp_path, "dress.val.json", [MTFIQ_OK, bad])
    err = raises(mtfiq.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, field)


def test_mtfiq_bad_attributes(tmp_path):
    path = write(tmp_path, "asin2attr.dress.val.new.json", {"B1": [["a"]], "B2": ["a", "b"]})
    err = raises(mtfiq.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 1, "B2")
