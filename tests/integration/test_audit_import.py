"""manage.py import_ranks on hand-written CIRCUS-layout rank files (tests/fixtures/circus_audit)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditLabel, AuditRank, AuditRun
from audit.runs import panels
from retrieval.loader import load_parsed
from retrieval.models import Image, Query
from retrieval.records import ImageRecord, ParsedDataset, QueryRecord, TargetRecord, TextRecord, TurnRecord
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

DIR = FIXTURES / "circus_audit"
ALPHA = DIR / "retrieval_data_tiny_task7_alpha.json"
BETA = DIR / "retrieval_data_tiny_task7_beta.json"
AGG = DIR / "retrieval_data_tiny_task7_aggregated_best_rank_mm_any.json"
TEXTS = ["is red", "has two dogs", "make it bigger", "remove the cat", "on a beach", "at night"]
# hand-worked in the fixture README
EXPECTED = {
    0: "shortcut_solvable",
    1: "composition_required",
    2: "unresolved",
    3: "shortcut_solvable",
    4: "composition_required",
    5: "shortcut_solvable",
}
DETAIL = {
    0: "both_unimodal",
    1: "composition_required",
    2: "unresolved",
    3: "both_unimodal",
    4: "composition_required",
    5: "image_only",
}
SUPPORT = {0: (2, 1, 1, 2), 1: (1, 0, 0, 0), 2: (0, 0, 0, 0), 3: (2, 1, 2, 2), 4: (1, 0, 0, 0), 5: (2, 0, 1, 1)}


@pytest.fixture
def tiny(db):
    return build_tiny("mbeir")


def build_tiny(fmt: str, extra: int = 0) -> dict[int, int]:
    """The six hand-worked queries (``extra``: more, which the rank files do not rank)."""
    parsed = ParsedDataset(format=fmt)
    for i in range(16):
        parsed.add_image(ImageRecord(external_id=f"img_{i:02d}", path=f"gallery/img_{i:02d}.png"))
    parsed.galleries["test"] = [f"img_{i:02d}" for i in range(16)]
    for i, text in enumerate(TEXTS + [f"extra {n}" for n in range(extra)]):
        parsed.queries.append(
            QueryRecord(
                external_id=f"q{i}",
                split="test",
                ordinal=i,
                source_file="tiny_test.jsonl",
                turns=[TurnRecord(index=1, reference=f"img_{2 * i:02d}", texts=[TextRecord(text)])],
                targets=[TargetRecord(image=f"img_{2 * i + 1:02d}", is_primary=True)],
                raw={"qid": i},
            )
        )
    load_parsed(parsed, "tiny")
    return {q.ordinal: q.pk for q in Query.objects.filter(dataset__name="tiny")}


def labels_by_ordinal(run: AuditRun) -> dict[int, str]:
    return {lab.query.ordinal: lab.label for lab in AuditLabel.objects.filter(run=run).select_related("query")}


def imp(*args) -> tuple[AuditRun, str]:
    out = StringIO()
    call_command("import_ranks", *map(str, args), stdout=out, stderr=StringIO())
    return AuditRun.objects.order_by("-pk").first(), out.getvalue()


def test_per_retriever_files_make_a_labelled_run(tiny):
    run, out = imp("--dataset", "tiny", ALPHA, BETA)
    assert run.status == "done" and run.source == "imported"
    assert run.retrievers == ["alpha", "beta"] and run.external_retrievers == ["alpha", "beta"]
    assert run.k == 10
    assert labels_by_ordinal(run) == EXPECTED
    for lab in AuditLabel.objects.filter(run=run).select_related("query"):
        i = lab.query.ordinal
        assert lab.detail == DETAIL[i]
        assert (lab.support_mm, lab.support_text, lab.support_image, lab.support_either) == SUPPORT[i]
    assert run.summary["counts"] == {
        "composition_required": 2,
        "unresolved": 1,
        "shortcut_solvable": 3,
        "shortcut_free": 3,
    }
    # per-retriever Recall@10, hand-counted: alpha mm 2,5,12,1,15,4 -> 4 of 6
    assert run.summary["retriever_stats"]["alpha"]["recall_at_k"]["multimodal"] == pytest.approx(4 / 6)
    assert run.summary["retriever_stats"]["beta"]["recall_at_k"]["text_only"] == 0.0
    # one row per (query, retriever); top lists mapped to the dataset's images by path
    assert AuditRank.objects.filter(run=run).count() == 12
    row = AuditRank.objects.get(run=run, retriever="beta", query_id=tiny[0])
    assert (row.mm, row.text, row.image) == (1, 14, 2)
    first = Image.objects.get(pk=row.top_mm[0])
    assert first.external_id == "img_01"  # beta ranks query 0's target first
    assert len(row.top_mm) == 12  # every listed result (the file has 12; up to AUDIT_CANDIDATES_N are kept)
    q0 = Query.objects.get(pk=tiny[0])
    panel = panels.candidate_panel(q0, panels.pool_rankings(run, q0), 12)
    names = dict(Image.objects.filter(pk__in=panel.ids).values_list("pk", "external_id"))
    # fused by reciprocal rank: alpha's first (img_02) leads; beta's first is the target (img_01),
    # which the panel leaves out, as it leaves out the reference (img_00)
    assert names[panel.ids[0]] == "img_02"
    assert not {"img_01", "img_00"} & set(names.values())
    assert len(panel.ids) == len(set(panel.ids)) == 12
    assert "composition_required" in out


def test_aggregated_file_gives_the_same_labels_and_keeps_the_pool_support(tiny):
    run, out = imp("--dataset", "tiny", AGG)
    assert run.retrievers == ["aggregated:best_rank_mm_recoverable"]
    assert labels_by_ordinal(run) == EXPECTED
    assert run.summary["import"]["label_agreement"] == {"same": 6, "different": 0, "different_queries": []}
    for lab in AuditLabel.objects.filter(run=run).select_related("query"):
        assert (lab.support_mm, lab.support_text, lab.support_image, lab.support_either) == SUPPORT[lab.query.ordinal]
    assert run.summary["support_histograms"]["multimodal"] == {"0": 1, "1": 2, "2": 3}
    assert "agree with the file's for 6 queries" in out
    with pytest.raises(CommandError, match="min_mm_retrievers > 1"):
        imp("--dataset", "tiny", "--min-mm-retrievers", "2", AGG)
    with pytest.raises(CommandError, match="import it alone"):
        imp("--dataset", "tiny", AGG, ALPHA)


def test_external_retriever_joins_an_existing_run(tiny):
    alone, _ = imp("--dataset", "tiny", ALPHA)
    # alpha alone: idx 1 text 30 image 25 mm 5 -> composition_required; idx 0 text 10 -> shortcut
    assert labels_by_ordinal(alone)[0] == "shortcut_solvable"
    assert labels_by_ordinal(alone)[4] == "unresolved"  # alpha mm 15; beta's mm 10 not in the pool yet
    joined, _ = imp("--dataset", "tiny", "--run", alone.pk, BETA)
    assert joined.pk == alone.pk and joined.retrievers == ["alpha", "beta"]
    assert labels_by_ordinal(joined) == EXPECTED
    with pytest.raises(CommandError, match="already has retriever"):
        imp("--dataset", "tiny", "--run", alone.pk, BETA)


def test_k_option_and_unknown_queries(tiny):
    run, _ = imp("--dataset", "tiny", "--k", "9", ALPHA, BETA)
    labels = labels_by_ordinal(run)
    assert labels[0] == "shortcut_solvable"  # image 2 (beta) still within 9
    assert labels[4] == "unresolved"  # best mm 10 > 9
    assert labels[5] == "composition_required"  # image 10 > 9, mm 4
    Query.objects.filter(pk=tiny[5]).delete()
    run, _ = imp("--dataset", "tiny", ALPHA, BETA)
    assert run.summary["import"]["unknown_query_idx"] == 1
    assert run.summary["skipped"] == {"unknown_query_idx": 1}
    assert len(labels_by_ordinal(run)) == 5


def test_malformed_rank_file_is_refused(tiny, tmp_path):
    bad = tmp_path / "retrieval_data_tiny_task7_bad.json"
    bad.write_text(
        '{"metadata": {}, "gallery_paths": [], "samples": [{"query_idx": 0, "ranks": '
        '{"multimodal": 0, "text_only": 1, "image_only": 1}}]}'
    )
    with pytest.raises(CommandError, match=r"sample 0, field 'ranks.multimodal'"):
        imp("--dataset", "tiny", bad)
    with pytest.raises(CommandError, match="no dataset"):
        imp("--dataset", "nope", ALPHA)


@pytest.fixture
def other(tiny):
    """A second dataset with the same images and query positions but other query texts: the
    tiny rank files are not its files."""
    parsed = ParsedDataset(format="mbeir")
    for i in range(16):
        parsed.add_image(ImageRecord(external_id=f"img_{i:02d}", path=f"gallery/img_{i:02d}.png"))
    parsed.galleries["test"] = [f"img_{i:02d}" for i in range(16)]
    for i, text in enumerate(TEXTS):
        words = text if i in (1, 3) else f"another query {i}"  # 4 of the 6 texts differ
        parsed.queries.append(
            QueryRecord(
                external_id=f"o{i}",
                split="test",
                ordinal=i,
                source_file="other_test.jsonl",
                turns=[TurnRecord(index=1, reference=f"img_{2 * i:02d}", texts=[TextRecord(words)])],
                targets=[TargetRecord(image=f"img_{2 * i + 1:02d}", is_primary=True)],
                raw={"qid": i},
            )
        )
    load_parsed(parsed, "other")
    return "other"


def test_rank_files_of_another_dataset_are_refused_unless_forced(other):
    before = AuditRun.objects.count()
    with pytest.raises(CommandError) as refused:
        imp("--dataset", other, ALPHA, BETA)
    text = str(refused.value)
    assert "do not match dataset 'other'" in text and "query texts of 4 of the 6 matched queries differ" in text
    assert "query_idx [0, 2, 4, 5]" in text
    assert "the file says 'is red', the dataset 'another query 0'" in text  # one example, both texts
    assert "Nothing was imported; force the import (--force) to import them anyway." in text
    assert AuditRun.objects.count() == before and not AuditRank.objects.exists()

    err = StringIO()
    call_command("import_ranks", "--dataset", other, "--force", str(ALPHA), str(BETA), stdout=StringIO(), stderr=err)
    run = AuditRun.objects.order_by("-pk").first()
    assert run.status == "done" and run.summary["import"]["forced"] is True
    assert run.summary["import"]["text_mismatches"] == 4  # queries (each named by both files)
    assert "imported with --force although 4 query text(s) differ" in err.getvalue()
    # the dataset's own files still import without --force
    own, _ = imp("--dataset", "tiny", ALPHA, BETA)
    assert own.summary["import"]["forced"] is False and own.summary["import"]["text_mismatches"] == 0


@pytest.mark.parametrize("fmt", ["mbeir", "cirr"])
def test_protocol_figures_of_one_number_rank_files(db, fmt):
    """A rank file's one number per query is the best positive's rank: the protocol's recalls
    read it (they were all 0), what needs more (CIRR's Recall_subset) is undefined, not 0, and
    the reference handling is stated as the file's, unknown."""
    from audit.protocol import run_protocol
    from retrieval.metrics import recall_at_k
    from retrieval.models import Dataset

    build_tiny(fmt)
    run, _ = imp("--dataset", "tiny", ALPHA)
    data = run_protocol(run)
    best = list(
        AuditRank.objects.filter(run=run, retriever="alpha").order_by("query__ordinal").values_list("mm", flat=True)
    )
    assert Dataset.objects.get(name="tiny").format == fmt and len(best) == len(TEXTS)
    row = next(r for r in data["rows"] if r["retriever"] == "alpha" and r["modality"] == "multimodal")
    ks = (5, 10) if fmt == "mbeir" else (1, 5, 10, 50)
    assert [row[f"R@{k}"] for k in ks] == [recall_at_k(best, k) for k in ks]
    assert any(row[f"R@{k}"] for k in ks)  # not every figure 0, as before
    assert data["reference"].startswith("as in the rank file")
    if fmt == "cirr":
        assert row["Recall_subset@1"] is None and row["Avg"] is None
        assert any("Recall_subset" in w for w in data["warnings"])


def test_queries_a_rank_file_leaves_out_are_warned_of(db):
    from audit.protocol import run_protocol

    build_tiny("cirr", extra=2)
    run, _ = imp("--dataset", "tiny", ALPHA)
    data = run_protocol(run)
    assert data["queries"] == len(TEXTS)
    assert any(f"2 of the scope's {len(TEXTS) + 2} queries were not ranked" in w for w in data["warnings"])


def build_two_categories() -> dict[str, dict[int, int]]:
    """A FashionIQ-like dataset: categories dress and shirt of split val, each source file's
    queries counted from 0 (``cap.<category>.val.json``), dress's texts the fixture's."""
    parsed = ParsedDataset(format="fashioniq")
    for i in range(16):
        parsed.add_image(ImageRecord(external_id=f"img_{i:02d}", path=f"gallery/img_{i:02d}.png"))
    for category in ("dress", "shirt"):
        parsed.galleries[f"{category}/val"] = [f"img_{i:02d}" for i in range(16)]
        for i, text in enumerate(TEXTS):
            parsed.queries.append(
                QueryRecord(
                    external_id=f"{category}/val/{i:05d}",
                    split="val",
                    ordinal=i,
                    category=category,
                    source_file=f"cap.{category}.val.json",
                    turns=[
                        TurnRecord(
                            index=1,
                            reference=f"img_{2 * i:02d}",
                            texts=[TextRecord(text if category == "dress" else f"{category} {text}")],
                        )
                    ],
                    targets=[TargetRecord(image=f"img_{2 * i + 1:02d}", is_primary=True)],
                    raw={"i": i},
                    extra={"gallery": f"{category}/val"},
                )
            )
    load_parsed(parsed, "fiq")
    return {
        c: {q.ordinal: q.pk for q in Query.objects.filter(dataset__name="fiq", category=c)} for c in ("dress", "shirt")
    }


def test_a_category_scope_imports_one_fashioniq_category(db):
    """FashionIQ's categories each count their queries from 0: without a scope the import is
    refused and names the scopes to choose from; with ``dress/val`` (the scope run_audit takes)
    the files rank the dress queries only, and the run's scope says so."""
    by_category = build_two_categories()
    with pytest.raises(CommandError) as err:
        imp("--dataset", "fiq", ALPHA)
    assert "not unique" in str(err.value) and "dress/val, shirt/val" in str(err.value)
    with pytest.raises(CommandError, match="not unique"):
        imp("--dataset", "fiq", "--split", "val", ALPHA)
    with pytest.raises(CommandError, match="no category 'skirt'"):
        imp("--dataset", "fiq", "--split", "skirt/val", ALPHA)

    run, _ = imp("--dataset", "fiq", "--split", "dress/val", ALPHA)
    assert run.split == "dress/val"
    from audit.protocol import run_protocol

    data = run_protocol(run)
    assert list(data["rows"][0]["categories"]) == ["dress"] and data["queries"] == len(TEXTS)
    assert any("category 'dress' only" in w for w in data["warnings"])
    assert set(AuditLabel.objects.filter(run=run).values_list("query_id", flat=True)) == set(
        by_category["dress"].values()
    )
    # a retriever joining the run is matched in the run's scope (no --split needed) and keeps it
    joined, _ = imp("--dataset", "fiq", "--run", run.pk, BETA)
    assert joined.pk == run.pk and joined.split == "dress/val" and joined.retrievers == ["alpha", "beta"]
    assert {by_category["dress"][o]: lab for o, lab in EXPECTED.items()} == dict(
        AuditLabel.objects.filter(run=run).values_list("query_id", "label")
    )
    # the shirt queries' texts differ from the files': refused as another source file's
    with pytest.raises(CommandError, match="do not match"):
        imp("--dataset", "fiq", "--split", "shirt/val", ALPHA)


def test_a_reference_in_a_rank_files_top_lists_is_reported(db, tmp_path):
    """A rank file does not say whether its gallery kept the reference; a reference in its top
    lists shows it did. CIRR removes the reference, so the protocol table warns that the file's
    figures are understated; the fixture's files (no reference in any top list) get no warning."""
    import json

    from audit.protocol import reference_evidence, run_protocol

    build_tiny("cirr")
    data = json.loads(ALPHA.read_text())
    for s in data["samples"]:
        if s["query_idx"] in (1, 3):  # their references, img_02 and img_06, enter their top lists
            s["retrievals"]["multimodal"] = [2 * s["query_idx"], *s["retrievals"]["multimodal"][:-1]]
    kept = tmp_path / "retrieval_data_tiny_task7_kept.json"
    kept.write_text(json.dumps({**data, "metadata": {**data["metadata"], "retriever_module": "kept"}}))
    run, _ = imp("--dataset", "tiny", ALPHA)
    assert reference_evidence(run) == {"alpha": {"seen": 0, "lists": len(TEXTS)}}
    assert not any("reference image is in" in w for w in run_protocol(run)["warnings"])
    joined, _ = imp("--dataset", "tiny", "--run", run.pk, kept)
    name = joined.retrievers[-1]
    assert reference_evidence(joined)[name] == {"seen": 2, "lists": len(TEXTS)}
    warnings = [w for w in run_protocol(joined)["warnings"] if "reference image is in" in w]
    assert len(warnings) == 1 and warnings[0].startswith(f"{name}: the query's reference image is in 2 of the 6")
    assert "CIRR removes it" in warnings[0] and "understated" in warnings[0]
