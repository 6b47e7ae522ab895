"""demo_check's CIRCUS tables (audit.democheck.circus_tables / circus_lines), pure."""

from __future__ import annotations

from audit.democheck import circus_lines, circus_tables


def test_circus_tables_read_the_report_subsets_and_print_percent_and_gap():
    subsets = [
        {"name": "full", "n": 100, "stats": {"A": {"recall_at_k": {"multimodal": 0.5}, "comp_gap_ndcg": 0.25}}},
        {"name": "shortcut-free", "n": 40, "stats": {"A": {"recall_at_k": {"multimodal": 0.2}, "comp_gap_ndcg": None}}},
    ]
    tables = circus_tables(subsets, ["A"])
    assert tables["recall"] == [{"retriever": "A", "full": 0.5, "shortcut-free": 0.2, "validated": None}]
    assert tables["comp_gap"][0]["full"] == 0.25 and tables["sets"][2]["queries"] is None
    lines = circus_lines(tables, 10)
    assert lines[0].strip() == "Recall@10 (multimodal, %)"
    assert "Full (100)" in lines[1] and "Shortcut-free (40)" in lines[1]
    assert lines[2].split() == ["A", "50.0", "20.0", "-"]
    assert lines[-1].split() == ["A", "0.250", "-", "-"]
