"""import_dataset and dataset_stats as an admin runs them: counts, re-import, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from PIL import Image as PILImage

from retrieval.models import Dataset, GalleryEntry, Image, Query, Target, Turn
from tests.conftest import FIXTURES, ROOT, database_url_for_subprocess

DS = FIXTURES / "datasets"
pytestmark = pytest.mark.django_db


def stats(name: str) -> dict:
    out = StringIO()
    call_command("dataset_stats", name, "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def run_import(*args: str) -> str:
    out = StringIO()
    call_command("import_dataset", *args, stdout=out)
    return out.getvalue()


def row_counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Dataset, Image, Query, Turn, Target, GalleryEntry))


def test_circo_val_has_220_queries_with_1_to_14_targets():
    run_import("--format", "circo", "--name", "circo", str(DS / "circo" / "val.json"))
    s = stats("circo")
    records = json.loads((DS / "circo" / "val.json").read_text())
    assert s["queries"] == 220 == len(records)
    assert s["single_turn"] == 220 and s["multi_turn"] == 0
    assert s["turns_histogram"] == {"1": 220}
    assert s["targets_per_query_mean"] == pytest.approx(sum(len(r["gt_img_ids"]) for r in records) / 220, abs=1e-6)
    assert s["targets_per_query_mean"] == pytest.approx(4.16, abs=0.01)
    per_query = [q.targets.count() for q in Query.objects.filter(dataset__name="circo")]
    assert min(per_query) == 1 and max(per_query) == 14
    # the primary target is CIRCO's target_img_id
    q0 = Query.objects.get(dataset__name="circo", external_id=str(records[0]["id"]))
    assert q0.targets.get(is_primary=True).image.external_id == str(records[0]["target_img_id"])
    assert q0.raw == records[0]


def test_reimport_creates_no_duplicates():
    args = ("--format", "circo", "--name", "circo", str(DS / "circo" / "val.json"))
    run_import(*args)
    first = row_counts()
    stamp = Dataset.objects.get(name="circo").updated_at
    out = run_import(*args)
    assert "0 added, 0 changed, 0 removed, 220 unchanged" in out
    assert row_counts() == first
    assert Dataset.objects.get(name="circo").updated_at > stamp


def test_cirr_counts_match_files():
    caps = json.loads((DS / "cirr" / "cap.rc2.val.sample.json").read_text())
    split = json.loads((DS / "cirr" / "split.rc2.val.sample.json").read_text())
    run_import(
        "--format",
        "cirr",
        "--name",
        "cirr",
        *(
            str(DS / "cirr" / f)
            for f in ("cap.rc2.val.sample.json", "split.rc2.val.sample.json", "cap.ext.rc2.val.sample.json")
        ),
    )
    s = stats("cirr")
    assert s["queries"] == len(caps)
    hard = sum(1 for c in caps)
    soft_extra = sum(1 for c in caps for k in c["target_soft"] if k != c["target_hard"])
    assert Target.objects.filter(query__dataset__name="cirr").count() == hard + soft_extra
    assert GalleryEntry.objects.filter(dataset__name="cirr").count() == len(split)


def test_fashioniq_counts_match_files():
    files = sorted((DS / "fashioniq").glob("*.val.sample.json"))
    n = sum(len(json.loads(f.read_text())) for f in files if f.name.startswith("cap."))
    run_import("--format", "fashioniq", "--name", "fiq", *map(str, files))
    s = stats("fiq")
    assert s["queries"] == n and s["targets_per_query_mean"] == 1.0
    turn = Turn.objects.filter(query__dataset__name="fiq").first()
    assert len(turn.texts) == 2 and {t["annotator"] for t in turn.texts} == {0, 1}


def test_lasco_corpus_counts_match_file():
    corpus = json.loads((DS / "lasco" / "lasco_val_corpus.sample.json").read_text())
    run_import("--format", "lasco", "--name", "lasco", str(DS / "lasco" / "lasco_val_corpus.sample.json"))
    s = stats("lasco")
    assert s["images"] == len(corpus) > 0
    assert s["queries"] == 0
    assert GalleryEntry.objects.filter(dataset__name="lasco").count() == len(corpus)


def test_multiturn_fashioniq_sessions():
    files = [DS / "mtfiq" / "dress.val.sample.json", DS / "mtfiq" / "shirt.val.sample.json"]
    sessions = [s for f in files for s in json.loads(f.read_text())]
    run_import("--format", "mtfiq", "--name", "mtfiq", *map(str, files))
    s = stats("mtfiq")
    assert s["queries"] == len(sessions) and s["multi_turn"] == sum(len(x["reference"]) > 1 for x in sessions)
    expected_hist: dict[str, int] = {}
    for x in sessions:
        expected_hist[str(len(x["reference"]))] = expected_hist.get(str(len(x["reference"])), 0) + 1
    assert s["turns_histogram"] == expected_hist


def test_missing_images_are_reported_not_fatal(tmp_path):
    records = json.loads((DS / "circo" / "val.json").read_text())[:3]
    ids = {r["reference_img_id"] for r in records} | {g for r in records for g in r["gt_img_ids"]}
    present = sorted(ids)[: len(ids) // 2]
    for coco_id in present:
        PILImage.new("RGB", (8, 6), "red").save(tmp_path / f"{coco_id:012d}.jpg")
    val = tmp_path / "val.json"
    val.write_text(json.dumps(records))
    out = run_import("--format", "circo", "--name", "c3", "--images-root", str(tmp_path), str(val))
    missing = len(ids) - len(present)
    assert f"{missing} of {len(ids)} images are missing" in out
    img = Image.objects.get(dataset__name="c3", external_id=str(present[0]))
    assert (img.width, img.height, img.missing) == (8, 6, False) and len(img.sha256) == 64
    assert stats("c3")["missing_images"] == missing


BAD_CASES = [
    # (file name, content, expected fragments of the message)
    ("val.json", '[{"id": 0, "reference_img_id": 1,', ["val.json", "JSON"]),
    (
        "val.json",
        json.dumps(
            [
                {
                    "id": 0,
                    "reference_img_id": 1,
                    "target_img_id": 2,
                    "relative_caption": "x",
                    "shared_concept": "c",
                    "gt_img_ids": [2],
                    "semantic_aspects": [],
                },
                {
                    "id": 1,
                    "reference_img_id": 3,
                    "target_img_id": 4,
                    "shared_concept": "c",
                    "gt_img_ids": [4],
                    "semantic_aspects": [],
                },
            ]
        ),
        ["record 2", "relative_caption"],
    ),
    (
        "val.json",
        json.dumps(
            [
                {
                    "id": 0,
                    "reference_img_id": 1,
                    "target_img_id": 2,
                    "relative_caption": "x",
                    "shared_concept": "c",
                    "gt_img_ids": "2",
                    "semantic_aspects": [],
                }
            ]
        ),
        ["record 1", "gt_img_ids"],
    ),
]


@pytest.mark.parametrize("fname,content,fragments", BAD_CASES, ids=["bad-json", "missing-field", "wrong-type"])
def test_malformed_circo_writes_nothing(tmp_path, fname, content, fragments):
    path = tmp_path / fname
    path.write_text(content)
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "circo", "--name", "bad", str(path))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert row_counts() == before


def lasco_triplet(qid: int, query_path: str) -> dict:
    return {"qid": qid, "query-image": [1, query_path], "query-text": "a dog", "target-image": [2, "val2014/b.jpg"]}


@pytest.mark.parametrize("bad_path", ["../../etc/passwd", "/etc/passwd", "val2014/../../x.jpg"])
def test_image_path_escaping_the_root_is_refused(tmp_path, bad_path):
    path = tmp_path / "lasco_val.json"
    path.write_text(json.dumps([lasco_triplet(1, "val2014/a.jpg"), lasco_triplet(2, bad_path)]))
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "lasco", "--name", "bad", "--images-root", str(tmp_path), str(path))
    assert "lasco_val.json" in str(err.value) and "record 2" in str(err.value) and "query-image" in str(err.value)
    assert row_counts() == before


def test_symlink_out_of_the_root_is_refused(tmp_path):
    root = tmp_path / "images"
    (root / "val2014").mkdir(parents=True)
    outside = tmp_path / "secret.jpg"
    PILImage.new("RGB", (4, 4)).save(outside)
    (root / "val2014" / "a.jpg").symlink_to(outside)
    path = tmp_path / "lasco_val.json"
    path.write_text(json.dumps([lasco_triplet(1, "val2014/a.jpg")]))
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "lasco", "--name", "bad", "--images-root", str(root), str(path))
    assert "escapes the images root" in str(err.value)
    assert row_counts() == before


def test_duplicate_query_id_is_refused_and_nothing_written(tmp_path):
    """A duplicate query id is refused by the parser, naming the second record."""
    rec = {
        "id": 0,
        "reference_img_id": 1,
        "target_img_id": 2,
        "relative_caption": "x",
        "shared_concept": "c",
        "gt_img_ids": [2],
        "semantic_aspects": [],
    }
    path = tmp_path / "val.json"
    path.write_text(json.dumps([rec, dict(rec)]))
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "circo", "--name", "dup", str(path))
    assert "record 2" in str(err.value) and "duplicate" in str(err.value) and "first at record 1" in str(err.value)
    assert row_counts() == before


@pytest.mark.django_db(transaction=True)
def test_cli_exit_code_and_message_on_bad_input(tmp_path):
    """The real command line: non-zero exit status and the file/record/field on stderr."""
    path = tmp_path / "val.json"
    path.write_text(BAD_CASES[1][1])
    env = dict(os.environ, DATABASE_URL=database_url_for_subprocess())
    proc = subprocess.run(
        [sys.executable, "manage.py", "import_dataset", "--format", "circo", "--name", "bad", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "record 2" in proc.stderr and "relative_caption" in proc.stderr and "nothing written" in proc.stderr
    assert not Dataset.objects.filter(name="bad").exists()


def test_unknown_dataset_stats_names_known_ones():
    run_import("--format", "circo", "--name", "circo", str(DS / "circo" / "val.json"))
    with pytest.raises(CommandError, match="known: circo"):
        call_command("dataset_stats", "nope", "--format", "json")


def test_mixing_formats_in_one_dataset_is_refused():
    run_import("--format", "circo", "--name", "mix", str(DS / "circo" / "val.json"))
    with pytest.raises(CommandError, match="imported as 'circo'"):
        run_import("--format", "lasco", "--name", "mix", str(DS / "lasco" / "lasco_val_corpus.sample.json"))


def test_nan_score_is_refused_naming_file_record_and_field(tmp_path):
    records = json.loads((DS / "cirr" / "cap.rc2.val.sample.json").read_text())
    key = next(iter(records[5]["target_soft"]))
    records[5]["target_soft"][key] = "__NAN__"
    path = tmp_path / "cap.rc2.val.json"
    path.write_text(json.dumps(records).replace('"__NAN__"', "NaN"))
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "cirr", "--name", "nan", str(path))
    assert f"cap.rc2.val.json, record 6, field 'target_soft.{key}'" in str(err.value)  # 1-based: records[5]
    assert "NaN" in str(err.value) and "JSON_VALID" not in str(err.value)
    assert row_counts() == before


def test_reimport_rewrites_only_changed_queries_and_keeps_the_rest(tmp_path):
    records = json.loads((DS / "circo" / "val.json").read_text())
    path = tmp_path / "val.json"
    path.write_text(json.dumps(records))
    run_import("--format", "circo", "--name", "circo", str(path))
    kept = Query.objects.get(dataset__name="circo", external_id=str(records[1]["id"]))
    kept_turn = kept.turns.get().pk
    records[0]["relative_caption"] = "a changed caption"
    records[0]["gt_img_ids"] = records[0]["gt_img_ids"][:1]
    path.write_text(json.dumps(records))
    out = run_import("--format", "circo", "--name", "circo", str(path))
    assert "0 added, 1 changed, 0 removed, 219 unchanged" in out
    changed = Query.objects.get(dataset__name="circo", external_id=str(records[0]["id"]))
    assert changed.turns.get().text == "a changed caption" and changed.targets.count() == 1
    assert changed.raw == records[0]
    assert kept.turns.get().pk == kept_turn  # untouched rows stay as they were


def test_duplicate_gallery_entries_warn_and_count_what_is_stored(tmp_path):
    asins = json.loads((DS / "mtfiq" / "split.dress.val.sample.json").read_text())
    path = tmp_path / "split.all.val.json"
    path.write_text(json.dumps(asins + asins[:5]))
    out = run_import("--format", "mtfiq", "--name", "gal", str(path))
    assert f"{len(asins)} gallery entries stored" in out
    assert "5 gallery entries are listed more than once" in out
    assert GalleryEntry.objects.filter(dataset__name="gal").count() == len(asins)


def test_release_file_names_import_with_overrides(tmp_path):
    dress = tmp_path / "dress.json"
    dress.write_text((DS / "mtfiq" / "dress.val.sample.json").read_text())
    run_import("--format", "mtfiq", "--name", "mt", "--split", "val", str(dress))
    assert set(Query.objects.filter(dataset__name="mt").values_list("split", "category").distinct()) == {
        ("val", "dress")
    }
    sessions = tmp_path / "circled_download.json"
    sessions.write_text((DS / "circled" / "circo_val.json").read_text())
    run_import("--format", "circled", "--name", "cl", "--subset", "circo_test", str(sessions))
    assert set(Query.objects.filter(dataset__name="cl").values_list("split", flat=True)) == {"test"}


def test_progress_follows_the_bytes_read(tmp_path):
    from retrieval.services import import_files

    seen = []
    paths = [DS / "circo" / "val.json"]
    import_files("circo", "prog", paths, progress=lambda stage, done, total: seen.append((stage, done, total)))
    size = paths[0].stat().st_size
    assert seen and all(stage == "importing" and total == size and 0 < done <= size for stage, done, total in seen)
    assert seen[-1] == ("importing", size, size)


def test_failure_after_written_batches_rolls_back_the_whole_import(tmp_path):
    """Records stream in batches: an error after the first batch is written still leaves nothing."""
    from retrieval.loader import BATCH

    base = json.loads((DS / "circo" / "val.json").read_text())
    records = [{**base[i % len(base)], "id": i} for i in range(BATCH + 100)]
    records[BATCH + 50]["relative_caption"] = 7
    path = tmp_path / "val.json"
    path.write_text(json.dumps(records))
    before = row_counts()
    with pytest.raises(CommandError) as err:
        run_import("--format", "circo", "--name", "late", str(path))
    assert f"record {BATCH + 51}, field 'relative_caption'" in str(err.value)  # 1-based
    assert row_counts() == before


def test_a_reimport_that_knows_less_keeps_the_stored_image_paths_and_files(tmp_path):
    """A CIRR caption file re-imported without its split file names no image path, and no
    --images-root: the stored paths, and the files found under the dataset's stored root,
    stay as the first import found them (they were blanked: every image then 'missing')."""
    split = json.loads((DS / "cirr" / "split.rc2.val.sample.json").read_text())
    for rel in split.values():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        PILImage.new("RGB", (4, 4), (9, 9, 9)).save(path)
    caps, splits = str(DS / "cirr" / "cap.rc2.val.sample.json"), str(DS / "cirr" / "split.rc2.val.sample.json")
    run_import("--format", "cirr", "--name", "cirr", "--images-root", str(tmp_path), caps, splits)
    before = {e: (p, sha, m) for e, p, sha, m in Image.objects.values_list("external_id", "path", "sha256", "missing")}
    present = sum(1 for _, _, m in before.values() if not m)
    assert present == len(split)

    out = run_import("--format", "cirr", "--name", "cirr", caps)
    after = {e: (p, sha, m) for e, p, sha, m in Image.objects.values_list("external_id", "path", "sha256", "missing")}
    assert after == before
    assert stats("cirr")["missing_images"] == len(before) - present
    assert "were not looked for" not in out and "0 updated" in out


def test_a_new_dataset_needs_a_slug_name_on_the_command_line_too():
    """The import form refused a name that is no slug; the command wrote it (it names URLs,
    subsets and export files)."""
    with pytest.raises(CommandError, match="use lowercase letters, digits, hyphens and underscores"):
        run_import("--format", "circo", "--name", "bad name!", str(DS / "circo" / "val.json"))
    assert not Dataset.objects.exists()
    run_import("--format", "circo", "--name", "good_name-2", str(DS / "circo" / "val.json"))
    assert Dataset.objects.get().name == "good_name-2"


def test_galleries_mixed_across_scopes_are_warned_of_except_where_the_benchmark_shares_one():
    """FashionIQ categories without their split files search every image, the other categories'
    included: the import says so. CIRCO's val and test both search COCO's one pool: no warning."""
    caps = [str(DS / "fashioniq" / f"cap.{c}.val.sample.json") for c in ("dress", "shirt")]
    out = run_import("--format", "fashioniq", "--name", "fiq", *caps, "--json")
    warnings = json.loads(out)["warnings"]
    assert any(w.startswith("the queries of dress/val, shirt/val have no gallery of their own") for w in warnings)
    out = run_import(
        "--format",
        "circo",
        "--name",
        "circo",
        str(DS / "circo" / "val.json"),
        str(DS / "circo" / "test.sample.json"),
        "--json",
    )
    assert set(Query.objects.filter(dataset__name="circo").values_list("split", flat=True)) == {"val", "test"}
    assert not any("no gallery of their own" in w for w in json.loads(out)["warnings"])
