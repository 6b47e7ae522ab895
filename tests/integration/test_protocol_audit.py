"""Protocol-exact audits of real benchmark files (tests/fixtures/datasets: real FashionIQ, CIRR
and CIRCO records) with a tiny open_clip retriever on generated images.

* FashionIQ's three val categories imported as ONE dataset: each query ranks against its own
  category's gallery (retrieval.galleries), in the audit; the per-category R@10/R@50 of the
  protocol report equal CLIP4Cir's evaluation logic (tests/reference_impl.py) on the very
  embeddings the audit used, to 1e-9.
* ``--split dress/val`` audits one category against its gallery.
* CIRR and CIRCO: the protocol figures equal CLIP4Cir's and CIRCO's evaluation.py logic on the
  audit's embeddings; CIRCO's small gallery is warned about.
"""

from __future__ import annotations

import json
import zlib
from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command
from PIL import Image as PILImage

from audit.models import AuditRank, AuditRun
from audit.protocol import run_protocol
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos, encode_images, encode_texts, get_retriever
from audit.runs.execution import embedding_cache
from retrieval.galleries import gallery_image_ids, query_gallery_keys
from retrieval.models import Dataset, GalleryEntry, Image, Query, Turn
from retrieval.targets import positive_targets
from tests.conftest import FIXTURES
from tests.reference_impl import circo_evaluation, clip4cir_cirr, clip4cir_fiq, searle_circo_predictions

pytestmark = pytest.mark.django_db
DS = FIXTURES / "datasets"
SPEC = "openclip:cirval-tiny-vit"


def draw_images(root, names):
    """One small distinct picture per image name (random colours and stripes, seeded by name)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        pixels = np.repeat(rng.integers(0, 255, (1, 24, 3)), 24, axis=0) ^ rng.integers(0, 60, (24, 24, 3))
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        PILImage.fromarray(pixels.astype(np.uint8)).save(path)


def import_dataset(*args):
    call_command("import_dataset", *args, stdout=StringIO())


@pytest.fixture
def cache_dir(tmp_path, settings):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    clear_memos()
    yield
    clear_memos()


def audit(dataset, **kw):
    run = planning.create_run(dataset, [SPEC], chunk_queries=20, chunk_gallery=150, **kw)
    run = dispatch.run_inline(run)
    assert run.status == "done", run.error
    return run


def embeddings(dataset, query_ids, image_ids):
    """The audit's own embeddings (from its cache): multimodal queries and gallery images."""
    retriever = get_retriever(SPEC)
    cache = embedding_cache(retriever)
    sha = dict(Image.objects.filter(pk__in=image_ids).values_list("pk", "sha256"))
    files = dict(Image.objects.filter(dataset=dataset).values_list("sha256", "path"))
    locate = lambda key: __import__("pathlib").Path(dataset.images_root) / files[key]  # noqa: E731
    gallery = encode_images(retriever, cache, [sha[i] for i in image_ids], locate)
    assert all(gallery.ok) and gallery.encoded == 0  # every one cached by the audit
    turns = {
        t.query_id: t for t in Turn.objects.filter(query_id__in=query_ids, index=1).select_related("reference_image")
    }
    img = encode_images(retriever, cache, [turns[q].reference_image.sha256 for q in query_ids], locate)
    txt = encode_texts(retriever, cache, [turns[q].text for q in query_ids])
    return retriever.compose(img.matrix, txt.matrix).float(), gallery.matrix.float()


def test_fashioniq_categories_rank_against_their_own_gallery(tmp_path, cache_dir, client, demo_accounts):
    files = sorted((DS / "fashioniq").glob("*.val.sample.json"))
    asins = {a for f in files if f.name.startswith("split.") for a in json.loads(f.read_text())}
    asins |= {
        r[k]
        for f in files
        if f.name.startswith("cap.")
        for r in json.loads(f.read_text())
        for k in ("candidate", "target")
    }
    draw_images(tmp_path / "img", [f"{a}.jpg" for a in asins])
    import_dataset("--format", "fashioniq", "--name", "fiq", "--images-root", str(tmp_path / "img"), *map(str, files))
    ds = Dataset.objects.get(name="fiq")
    run = audit(ds)
    galleries = run.summary["plan"]["gallery"]["galleries"]
    assert set(galleries) == {"dress/val", "shirt/val", "toptee/val"}
    assert sum(galleries.values()) == run.summary["plan"]["gallery"]["images"]  # the categories share no image
    assert run.summary["plan"]["gallery"]["mixed"] == []

    keys = query_gallery_keys(Query.objects.filter(dataset=ds).values("pk"))
    category = dict(Query.objects.filter(dataset=ds).values_list("pk", "category"))
    assert all(keys[q] == f"{category[q]}/val" for q in keys)
    for qid, top in AuditRank.objects.filter(run=run).values_list("query_id", "top_mm"):
        assert set(top) <= set(gallery_image_ids(ds.pk, keys[qid]))

    report = run_protocol(run)
    assert report["reference"] == "kept" and report["benchmark"] == "FashionIQ"
    row = next(r for r in report["rows"] if r["modality"] == "multimodal")
    expected = {}
    for cat in ("dress", "shirt", "toptee"):
        qids = list(
            AuditRank.objects.filter(run=run, query__category=cat)
            .order_by("query_id")
            .values_list("query_id", flat=True)
        )
        g_ids = gallery_image_ids(ds.pk, f"{cat}/val")
        queries, gallery = embeddings(ds, qids, g_ids)
        targets = [positive_targets("fashioniq", Query.objects.get(pk=q).targets.all())[0].image_id for q in qids]
        expected[cat] = clip4cir_fiq((queries @ gallery.T).numpy(), g_ids, targets)
        for k in (10, 50):
            assert row["categories"][cat][f"R@{k}"] * 100 == pytest.approx(expected[cat][f"R@{k}"], abs=1e-9)
    for k in (10, 50):
        assert row[f"R@{k}"] * 100 == pytest.approx(np.mean([e[f"R@{k}"] for e in expected.values()]), abs=1e-9)

    # the audit page: one table, percent, a row per retriever and modality, per category first
    assert client.login(username="researcher", password=demo_accounts["researcher"])
    html = client.get(f"/audits/{run.pk}/").content.decode()
    assert "dress/val 199, shirt/val 198, toptee/val 203; each query searches its own" in html
    table = html[html.index('id="protocol"') :]
    table = table[: table.index("</section>")]
    assert "FashionIQ, as its protocol reports it" in table and "<strong>kept</strong>" in table
    for header in ("dress R@10", "shirt R@50", "toptee R@10", "mean R@10", "mean R@50", "Avg"):
        assert f">{header}<" in table
    assert table.count("<tr><td>") == 3 and table.count("<code>") == 1  # one retriever, three modalities
    assert f">{100 * row['categories']['dress']['R@50']:.2f}<" in table

    # one category of the split: its queries, its gallery only
    dress = audit(ds, split="dress/val")
    assert dress.split == "dress/val"
    assert dress.summary["plan"]["gallery"]["galleries"] == {"dress/val": galleries["dress/val"]}
    assert set(AuditRank.objects.filter(run=dress).values_list("query__category", flat=True)) == {"dress"}
    out = StringIO()
    call_command("audit_report", "--run", str(dress.pk), "--format", "json", stdout=out)
    protocol = json.loads(out.getvalue())["protocol"]
    assert list(protocol["rows"][0]["categories"]) == ["dress"]
    assert protocol["rows"][0]["categories"]["dress"]["R@10"] == row["categories"]["dress"]["R@10"]


def test_cirr_protocol_equals_clip4cir(tmp_path, cache_dir):
    files = [DS / "cirr" / n for n in ("cap.rc2.val.sample.json", "split.rc2.val.sample.json")]
    split = json.loads(files[1].read_text())
    draw_images(tmp_path / "img", [p.removeprefix("./") for p in split.values()])
    import_dataset("--format", "cirr", "--name", "cirr", "--images-root", str(tmp_path / "img"), *map(str, files))
    ds = Dataset.objects.get(name="cirr")
    run = audit(ds)
    report = run_protocol(run)
    assert report["reference"] == "removed"
    row = next(r for r in report["rows"] if r["modality"] == "multimodal")
    qids = list(AuditRank.objects.filter(run=run).order_by("query_id").values_list("query_id", flat=True))
    g_ids = gallery_image_ids(ds.pk, "val")
    queries, gallery = embeddings(ds, qids, g_ids)
    by_ext = dict(Image.objects.filter(dataset=ds).values_list("external_id", "pk"))
    q = {x.pk: x for x in Query.objects.filter(pk__in=qids).prefetch_related("targets", "turns")}
    refs = [q[i].turns.all()[0].reference_image_id for i in qids]
    targets = [positive_targets("cirr", q[i].targets.all())[0].image_id for i in qids]
    members = [[by_ext[m] for m in q[i].extra["img_set"]["members"] if m in by_ext] for i in qids]
    theirs = clip4cir_cirr((queries @ gallery.T).numpy(), g_ids, refs, targets, members)
    for key, value in theirs.items():
        assert row[key] * 100 == pytest.approx(value, abs=1e-9), key


def import_circo(tmp_path, n: int = 60) -> tuple[Dataset, list[dict]]:
    """The first ``n`` CIRCO val queries with drawn images, as dataset ``circo``, and their records
    (also the leaderboard test's)."""
    val = json.loads((DS / "circo" / "val.json").read_text())[:n]
    (tmp_path / "val.json").write_text(json.dumps(val))
    ids = {r["reference_img_id"] for r in val} | {g for r in val for g in r["gt_img_ids"]}
    draw_images(tmp_path / "img", [f"{i:012d}.jpg" for i in ids])
    import_dataset(
        "--format", "circo", "--name", "circo", "--images-root", str(tmp_path / "img"), str(tmp_path / "val.json")
    )
    return Dataset.objects.get(name="circo"), val


def test_circo_protocol_equals_evaluation_py_and_warns_on_a_small_gallery(tmp_path, cache_dir):
    ds, val = import_circo(tmp_path)
    run = audit(ds)
    report = run_protocol(run)
    assert report["reference"] == "kept"
    assert any("123,403" in w for w in report["warnings"])
    row = next(r for r in report["rows"] if r["modality"] == "multimodal")
    qids = list(AuditRank.objects.filter(run=run).order_by("query_id").values_list("query_id", flat=True))
    g_ids = gallery_image_ids(ds.pk, None)
    queries, gallery = embeddings(ds, qids, g_ids)
    ext = dict(Image.objects.filter(dataset=ds).values_list("pk", "external_id"))
    names = [int(ext[i]) for i in g_ids]
    query_ext = dict(Query.objects.filter(pk__in=qids).values_list("pk", "external_id"))
    assert len(qids) == len(val)  # every query ranked: the script needs the ids 0 .. n-1
    theirs = circo_evaluation(
        searle_circo_predictions((queries @ gallery.T).numpy(), names, [query_ext[q] for q in qids]), val
    )
    for key, value in theirs.items():
        assert row[key] * 100 == pytest.approx(value, abs=1e-9), key
    assert GalleryEntry.objects.filter(dataset=ds).count() == 0


def test_categories_without_their_split_files_are_warned_of_at_import_audit_and_protocol(
    tmp_path, cache_dir, client, demo_accounts
):
    """Only dress's split file given: shirt's and toptee's queries have no gallery of their own
    and search every image of the dataset, dress's included. The import, the audit page and the
    protocol table say so (the per-category figures were printed as if each had its gallery)."""
    caps = sorted((DS / "fashioniq").glob("cap.*.val.sample.json"))
    split = DS / "fashioniq" / "split.dress.val.sample.json"
    asins = set(json.loads(split.read_text())) | {
        r[k] for f in caps for r in json.loads(f.read_text()) for k in ("candidate", "target")
    }
    draw_images(tmp_path / "img", [f"{a}.jpg" for a in asins])
    out = StringIO()
    call_command(
        "import_dataset",
        "--format",
        "fashioniq",
        "--name",
        "fiq",
        "--images-root",
        str(tmp_path / "img"),
        *map(str, caps),
        str(split),
        stdout=out,
    )
    assert "the queries of shirt/val, toptee/val have no gallery of their own" in out.getvalue()
    run = audit(Dataset.objects.get(name="fiq"))
    gallery = run.summary["plan"]["gallery"]
    assert gallery["mixed"] == ["shirt/val", "toptee/val"] and set(gallery["galleries"]) == {"dress/val", "*"}
    warning = next(w for w in run_protocol(run)["warnings"] if "no gallery of their own" in w)
    assert warning.startswith("the queries of shirt/val, toptee/val")
    assert client.login(username="researcher", password=demo_accounts["researcher"])
    html = client.get(f"/audits/{run.pk}/").content.decode()
    assert "every image " in html and html.count("the queries of shirt/val, toptee/val have no gallery") == 2

    # one category audited alone still searches the other categories' images; dress has its own
    shirt = audit(Dataset.objects.get(name="fiq"), split="shirt/val")
    assert shirt.summary["plan"]["gallery"]["mixed"] == ["shirt/val"]
    assert audit(Dataset.objects.get(name="fiq"), split="dress/val").summary["plan"]["gallery"]["mixed"] == []


def test_targets_outside_the_gallery_are_warned_of_by_the_command_and_the_protocol(tmp_path, cache_dir):
    """A FashionIQ split file cut short: many targets are in no gallery. Those queries can only be
    labelled unresolved and ranked as misses; run_audit and the protocol table say how many."""
    caps = DS / "fashioniq" / "cap.dress.val.sample.json"
    records = json.loads(caps.read_text())
    split = sorted(json.loads((DS / "fashioniq" / "split.dress.val.sample.json").read_text()))
    kept = [a for a in split if a not in {r["target"] for r in records[:5]}][:40]
    cut = tmp_path / "split.dress.val.json"
    cut.write_text(json.dumps(kept))
    draw_images(
        tmp_path / "img", [f"{a}.jpg" for a in set(kept) | {r[k] for r in records for k in ("candidate", "target")}]
    )
    import_dataset(
        "--format", "fashioniq", "--name", "cut", "--images-root", str(tmp_path / "img"), str(caps), str(cut)
    )
    out, err = StringIO(), StringIO()
    call_command("run_audit", "--dataset", "cut", "--retriever", SPEC, "--eager", stdout=out, stderr=err)
    run = AuditRun.objects.get(dataset__name="cut")
    missing = sum(1 for r in records if r["target"] not in set(kept))
    assert missing >= 5 and run.summary["no_positive_in_gallery"] == missing
    assert f"warning: {missing} queries had no ground truth in the gallery they searched" in err.getvalue()
    assert any(
        w.startswith(f"{missing} of the ranked queries had no ground truth") for w in run_protocol(run)["warnings"]
    )
