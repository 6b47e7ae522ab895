"""Rank files whose ranks list every positive target: audit_labels (JSONL) and import_ranks (CIRCUS JSON)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditRank, AuditRun
from tests.integration.test_audit_import import ALPHA, tiny  # noqa: F401  (fixture)

# K = 10. q1 has three positives: mm ranks 2, 7 and 30; its best text rank is 11 (a miss),
# its image ranks are all missing -> composition_required. q2: text list [None, 4] -> shortcut.
LINES = [
    {"query": "q1", "retriever": "A", "mm": [30, 2, 7], "text": [11, 40, None], "image": [None, None, None]},
    {"query": "q2", "retriever": "A", "mm": 12, "text": [None, 4], "image": 50},
]


def run_cli(path, *extra):
    out = StringIO()
    call_command("audit_labels", str(path), "--k", "10", *extra, stdout=out)
    return out.getvalue()


def test_audit_labels_reports_map_at_k_from_rank_lists(tmp_path):
    path = tmp_path / "lists.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in LINES) + "\n")
    doc = json.loads(run_cli(path, "--format", "json"))
    assert doc["labels"] == {"q1": "composition_required", "q2": "shortcut_solvable"}
    a = doc["retrievers"]["A"]
    # q1 AP@10 (mm): hits at 2 and 7, G = 3: (1/2 + 2/7) / 3; q2: rank 12 -> 0
    assert a["map_at_k"]["10"]["multimodal"] == pytest.approx((1 / 2 + 2 / 7) / 3 / 2)
    # AP@50 adds q1's third hit (3/30) and q2's rank 12
    assert a["map_at_k"]["50"]["multimodal"] == pytest.approx(((1 / 2 + 2 / 7 + 3 / 30) / 3 + 1 / 12) / 2)
    # q2 text: G = 2, one hit at 4 -> (1/4) / 2
    assert a["map_at_k"]["5"]["text_only"] == pytest.approx((1 / 4) / 2 / 2)
    assert a["recall_at_k"]["multimodal"] == 0.5  # best ranks 2 and 12
    assert a["mrr"]["multimodal"] == pytest.approx((1 / 2 + 1 / 12) / 2)
    assert set(a) >= {"recall_at_k", "mrr", "ndcg", "map_at_k"}


@pytest.mark.parametrize(
    "bad, field, what",
    [
        ({"mm": []}, "mm", "empty list"),
        ({"mm": [1, 0]}, "mm[1]", "got 0"),
        ({"text": [[1]]}, "text[0]", "cannot hold another list"),
        ({"image": [1, "2"]}, "image[1]", "got '2'"),
    ],
)
def test_audit_labels_bad_rank_lists_name_line_and_field(tmp_path, bad, field, what):
    line = {"query": "q", "retriever": "A", "mm": 1, "text": 2, "image": 3, **bad}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LINES[1]) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(CommandError) as err:
        run_cli(path)
    message = str(err.value)
    assert str(path) in message and "line 2" in message and f"field '{field}'" in message and what in message


def test_import_ranks_stores_every_positive_rank(tiny, tmp_path):  # noqa: F811
    doc = json.loads(ALPHA.read_text())
    doc["samples"][0]["ranks"] = {"multimodal": [2, 9], "text_only": [10, None], "image_only": [40, 41]}
    path = tmp_path / "retrieval_data_tiny_task7_lists.json"
    path.write_text(json.dumps(doc))
    call_command("import_ranks", "--dataset", "tiny", str(path), stdout=StringIO(), stderr=StringIO())
    run = AuditRun.objects.order_by("-pk").first()
    row = AuditRank.objects.get(run=run, query_id=tiny[0])
    assert (row.mm, row.text, row.image) == (2, 10, 40)
    assert (row.mm_all, row.text_all, row.image_all) == ([2, 9], [10, None], [40, 41])
    stats = run.summary["retriever_stats"]["lists"]
    assert "map_at_k" in stats and stats["map_at_k"]["10"]["multimodal"] is not None
    doc["samples"][1]["ranks"]["text_only"] = [3, -1]
    path.write_text(json.dumps(doc))
    with pytest.raises(CommandError, match=r"sample 1, field 'ranks.text_only\[1\]': a rank must be"):
        call_command("import_ranks", "--dataset", "tiny", str(path), stdout=StringIO(), stderr=StringIO())
