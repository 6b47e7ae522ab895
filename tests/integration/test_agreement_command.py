"""``manage.py agreement``: the CIRCUS study re-run through the command, a numeric ordinal
case, and every kind of malformed input.

CIRCUS fixtures: tests/fixtures/circus (see its README). annotator_03 and annotator_08 have
no assignment file; their labels come from the report's item_level_rows signatures.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from fractions import Fraction
from io import StringIO
from itertools import combinations
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from annotation.agreement.circus_files import (
    load_agreement_report,
    parse_assignment_file,
)
from annotation.agreement.maths import FLAGS
from tests.circus_triples import relabel_pairs, triples_from_annotations, triples_from_item_level_rows
from tests.conftest import FIXTURES, ROOT
from tests.unit.test_agreement import K_DATA, K_PUBLISHED, alpha_exact

CIRCUS = FIXTURES / "circus"
TOL = 1e-9


# --------------------------------------------------------------------------- helpers


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def as_records(triples: list) -> list[dict]:
    return [{"item": i, "annotator": a, "label": lab} for i, a, lab in triples]


def run_json(*args: str) -> dict:
    out = StringIO()
    call_command("agreement", *args, "--format", "json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def unordered(by_pair: dict[str, float]) -> dict[frozenset, float]:
    """Pair keys without their order (kappa is symmetric; the command sorts annotators)."""
    return {frozenset(k.split("__")): v for k, v in by_pair.items()}


@pytest.fixture(scope="module")
def published() -> dict:
    return load_agreement_report(CIRCUS / "agreement_report.json")


@pytest.fixture(scope="module")
def blind_triples() -> list:
    files = [parse_assignment_file(p) for p in sorted((CIRCUS / "agreement_users").glob("annotator_*.json"))]
    return [t for f in files for t in triples_from_annotations(f.annotations)]


@pytest.fixture(scope="module")
def all_triples(published, blind_triples) -> list:
    return blind_triples + triples_from_item_level_rows(published["item_level_rows"], ["annotator_03", "annotator_08"])


@pytest.fixture
def circus_file(tmp_path, all_triples) -> Path:
    records = as_records(all_triples)
    random.Random(5).shuffle(records)  # line order must not matter
    return write_jsonl(tmp_path / "circus.jsonl", records)


# --------------------------------------------------------------------------- CIRCUS


def assert_summary(mine: dict, theirs: dict) -> None:
    assert mine["count"] == theirs["count"]
    for key in ("mean", "median", "min", "max"):
        assert mine[key] == pytest.approx(theirs[key], abs=TOL), key


def check_validity_blocks(report: dict, expected: dict, raters: list[str]) -> None:
    """Every figure of a published block (all annotators or blind only), to 1e-9."""
    mine, theirs = report["binary_valid_invalid"], expected["binary_valid_invalid"]
    assert mine["n_items"] == theirs["n_items"] == report["n_items"] == 50
    assert mine["n_raters"] == theirs["n_raters"] == report["n_annotators"] == len(raters)
    for key in (
        "exact_agreement_rate",
        "exact_invalid_signature_rate",
        "unanimous_valid_invalid_rate",
        "fleiss_kappa",
        "krippendorff_alpha_nominal",
    ):
        assert mine[key] == pytest.approx(theirs[key], abs=TOL), key
    assert_summary(mine["pairwise_cohen"], theirs["pairwise_cohen"])
    # The published pair values are in pair order over ``raters`` under mislabelled keys.
    fixed = relabel_pairs([v for _, v in theirs["pairwise_cohen_by_pair"]], raters)
    assert len(mine["pairwise_cohen_by_pair"]) == len(fixed) == len(raters) * (len(raters) - 1) // 2
    assert unordered(mine["pairwise_cohen_by_pair"]) == pytest.approx(unordered(fixed), abs=TOL)
    for flag in FLAGS:
        m, t = report["per_flag_agreement"][flag], expected["per_flag_agreement"][flag]
        for key in ("fleiss_kappa", "krippendorff_alpha_nominal", "positive_rate"):
            assert m[key] == pytest.approx(t[key], abs=TOL), (flag, key)
        assert_summary(m["pairwise_cohen"], t["pairwise_cohen"])
    assert report["signature_alpha_nominal"] == pytest.approx(expected["signature_alpha_nominal"], abs=TOL)
    assert report["krippendorff_alpha"] == report["signature_alpha_nominal"]


def test_circus_study_through_the_command(circus_file, published) -> None:
    report = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "0", "--constant-pairs", "one")
    raters = published["all_annotators"]
    assert report["annotators"] == sorted(raters)  # the command orders annotators by name
    assert report["n_judgements"] == 450 and report["n_items_excluded"] == 0
    check_validity_blocks(report, published, raters)
    # Figures quoted in the CIRCUS notes, as fractions.
    b = report["binary_valid_invalid"]
    assert b["exact_agreement_rate"] == pytest.approx(11 / 50, abs=1e-15)
    assert b["unanimous_valid_invalid_rate"] == pytest.approx(22 / 50, abs=1e-15)
    assert b["exact_invalid_signature_rate"] == pytest.approx(6 / 17, abs=1e-15)
    # Every item has 9 ratings, so Fleiss' kappa applies at the top level too.
    assert report["fleiss_kappa"] is not None
    assert report["pairwise_cohen"]["count"] == 36 and report["pairwise_cohen"]["weights"] == "none"
    assert report["confidence_intervals"]["n_boot"] == 0


def test_circus_blind_only_through_the_command(tmp_path, blind_triples, published) -> None:
    path = write_jsonl(tmp_path / "blind.jsonl", as_records(blind_triples))
    report = run_json(str(path), "--rubric", "validity", "--bootstrap", "0", "--constant-pairs", "one")
    expected = published["blind_only_summary"]
    check_validity_blocks(report, expected, expected["users"])


def test_circus_bootstrap_is_seeded(circus_file) -> None:
    first = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "200", "--seed", "1")
    again = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "200", "--seed", "1")
    other = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "200", "--seed", "2")
    ci = first["confidence_intervals"]
    assert (ci["n_boot"], ci["seed"], ci["confidence"]) == (200, 1, 0.95)
    assert again["confidence_intervals"] == ci
    assert other["confidence_intervals"]["intervals"] != ci["intervals"]
    alpha = ci["intervals"]["binary_valid_invalid.krippendorff_alpha_nominal"]
    assert alpha["low"] < first["binary_valid_invalid"]["krippendorff_alpha_nominal"] < alpha["high"]
    assert alpha["n_boot"] == 200 and 0 < alpha["n_valid"] <= 200
    for key in ("percent_agreement", "krippendorff_alpha", "gwet_ac1", "pairwise_cohen_mean", "fleiss_kappa"):
        assert ci["intervals"][key]["low"] <= ci["intervals"][key]["high"], key


def test_default_bootstrap_and_text_format(circus_file, published) -> None:
    out = StringIO()
    call_command("agreement", str(circus_file), "--rubric", "validity", stdout=out, stderr=StringIO())
    text = out.getvalue()
    assert "50 items (0 excluded" in text and "9 annotators, 450 judgements" in text
    assert "1000 replicates, seed 0" in text  # the default bootstrap
    alpha = published["binary_valid_invalid"]["krippendorff_alpha_nominal"]
    assert f"{alpha:.4f}" in text
    for flag in FLAGS:
        assert flag in text
    assert "annotator_01__annotator_02" in text


# --------------------------------------------------------------------------- numeric (Krippendorff 2011)


@pytest.fixture
def kripp_file(tmp_path) -> Path:
    """Krippendorff (2011), 4 observers x 12 units with missing values (see tests/unit)."""
    records = [
        {"item": f"u{u + 1}", "annotator": "ABCD"[c], "label": K_DATA[c][u]}
        for c in range(4)
        for u in range(12)
        if K_DATA[c][u] is not None
    ]
    return write_jsonl(tmp_path / "kripp.jsonl", records)


# Observers A and B share units 1-9 and differ once (unit 6: 1 vs 2). Marginals over those
# units, categories 1..5: A (3, 3, 2, 1, 0), B (2, 4, 2, 1, 0). Expected disagreement
# sum |i-j| a_i b_j = 85, sum (i-j)^2 a_i b_j = 149 (over n = 9), observed 1 and 1, so
# linear kappa = 1 - 9/85 = 76/85 and quadratic kappa = 1 - 9/149 = 140/149.
A_B_KAPPA = {"linear": Fraction(76, 85), "quadratic": Fraction(140, 149)}


@pytest.mark.parametrize("level", ["ordinal", "interval", "ratio"])
def test_numeric_levels_through_the_command(kripp_file, level) -> None:
    report = run_json(str(kripp_file), "--level", level, "--bootstrap", "0")
    exact = alpha_exact(K_DATA, level)
    assert round(float(exact), 3) == K_PUBLISHED[level]
    assert report["krippendorff_alpha"] == pytest.approx(float(exact), abs=1e-12)
    # Unit 12 has a single rating: left out.
    assert (report["n_items"], report["n_items_excluded"], report["n_judgements"]) == (11, 1, 40)
    assert report["n_annotators"] == 4
    # Share of agreeing pairs per unit: 1, 1/2, 1, 1, 1, 0, 1, 1/2, 1, 1, 1 -> 9/11.
    assert report["percent_agreement"] == pytest.approx(9 / 11, abs=1e-15)
    assert report["fleiss_kappa"] is None and "not applicable" in report["undefined"]["fleiss_kappa"]
    pc = report["pairwise_cohen"]
    assert pc["weights"] == "quadratic"  # the one default (maths.default_kappa_weights), stated in the report
    assert report["spec"]["kappa_weights"] == "quadratic" and "quadratic weights" in report["spec"]["statement"]
    assert list(pc["by_pair"]) == [f"{a}__{b}" for a, b in combinations("ABCD", 2)]
    assert pc["by_pair"]["A__B"] == pytest.approx(float(A_B_KAPPA["quadratic"]), abs=1e-12)
    assert pc["shared_items_by_pair"]["A__B"] == 9
    linear = run_json(str(kripp_file), "--level", level, "--weights", "linear", "--bootstrap", "0")
    assert linear["pairwise_cohen"]["weights"] == "linear"
    assert linear["pairwise_cohen"]["by_pair"]["A__B"] == pytest.approx(float(A_B_KAPPA["linear"]), abs=1e-12)
    assert linear["krippendorff_alpha"] == report["krippendorff_alpha"]  # weights touch Cohen's kappa only


def test_ordinal_strings_follow_declared_categories(tmp_path) -> None:
    names = {1: "none", 2: "low", 3: "mid", 4: "high", 5: "max"}
    records = [
        {"item": u, "annotator": "ABCD"[c], "label": names[K_DATA[c][u]]}
        for c in range(4)
        for u in range(12)
        if K_DATA[c][u] is not None
    ]
    path = write_jsonl(tmp_path / "words.jsonl", records)
    report = run_json(str(path), "--level", "ordinal", "--categories", "none,low,mid,high,max", "--bootstrap", "0")
    assert report["krippendorff_alpha"] == pytest.approx(float(alpha_exact(K_DATA, "ordinal")), abs=1e-12)
    assert report["pairwise_cohen"]["by_pair"]["A__B"] == pytest.approx(140 / 149, abs=1e-12)  # quadratic
    assert list(report["label_prevalence"]) == ["none", "low", "mid", "high", "max"]
    # Without the declared order, strings are refused at the ordinal level.
    with pytest.raises(CommandError, match=r"line 1, field 'label': the ordinal level needs a number"):
        run_json(str(path), "--level", "ordinal")


def test_declared_scale_counts_unused_categories(tmp_path) -> None:
    # Two raters, 1-5 scale, only 1 and 2 used: Gwet's Q is 5 with --categories, else 2.
    records = [
        {"item": i, "annotator": r, "label": v}
        for i, (a, b) in enumerate([(1, 1), (1, 2), (2, 2), (1, 1)])
        for r, v in (("x", a), ("y", b))
    ]
    path = write_jsonl(tmp_path / "scale.jsonl", records)
    declared = run_json(str(path), "--level", "ordinal", "--categories", "1,2,3,4,5", "--bootstrap", "0")
    observed = run_json(str(path), "--level", "ordinal", "--bootstrap", "0")
    # p_a = 3/4; pi = (5/8, 3/8); sum pi (1 - pi) = 15/32.
    assert declared["gwet_ac1"] == pytest.approx((3 / 4 - 15 / 128) / (1 - 15 / 128), abs=1e-15)
    assert observed["gwet_ac1"] == pytest.approx((3 / 4 - 15 / 32) / (1 - 15 / 32), abs=1e-15)
    assert set(declared["label_prevalence"]) == {"1", "2", "3", "4", "5"}


def test_declared_categories_are_typed_like_the_labels(tmp_path) -> None:
    # String labels that look like numbers stay strings; numbers are matched numerically.
    words = [
        {"item": i, "annotator": r, "label": v}
        for i, r, v in [(1, "a", "1"), (1, "b", "2"), (2, "a", "2"), (2, "b", "2")]
    ]
    report = run_json(str(write_jsonl(tmp_path / "w.jsonl", words)), "--categories", "1,2,3", "--bootstrap", "0")
    assert report["label_prevalence"] == pytest.approx({"1": 0.25, "2": 0.75, "3": 0.0})
    numbers = [{**w, "label": float(w["label"])} for w in words]
    report = run_json(
        str(write_jsonl(tmp_path / "n.jsonl", numbers)),
        "--level",
        "interval",
        "--categories",
        "3,1,2",
        "--bootstrap",
        "0",
    )
    assert list(report["label_prevalence"]) == ["1", "2", "3"]  # sorted numerically
    # Gwet's AC1 with Q = 3: p_a = 1/2, pi = (1/4, 3/4, 0), p_e = (3/16 + 3/16) / 2 = 3/16.
    assert report["gwet_ac1"] == pytest.approx((1 / 2 - 3 / 16) / (1 - 3 / 16), abs=1e-15)


# --------------------------------------------------------------------------- malformed input

GOOD = '{"item": 1, "annotator": "A", "label": "x"}'
GOOD_B = '{"item": 1, "annotator": "B", "label": "y"}'

MALFORMED = [
    # (id, file text, extra args, fragments the error must contain)
    ("bad json", f'{GOOD}\n{{"item": 2, "annotator": "A", "label": "x"\n', [], ["line 2", "invalid JSON"]),
    ("not an object", "[1, 2, 3]\n", [], ["line 1", "expected a JSON object"]),
    ("missing label", f'{GOOD}\n{{"item": 2, "annotator": "A"}}\n', [], ["line 2, field 'label': missing"]),
    ("missing item", f'{GOOD}\n{GOOD_B}\n{{"annotator": "C", "label": "x"}}\n', [], ["line 3, field 'item': missing"]),
    ("missing annotator", '{"item": 1, "label": "x"}\n', [], ["line 1, field 'annotator': missing"]),
    ("item a float", '{"item": 1.5, "annotator": "A", "label": "x"}\n', [], ["line 1, field 'item'"]),
    ("item a list", f'{GOOD}\n{{"item": [1], "annotator": "A", "label": "x"}}\n', [], ["line 2, field 'item'"]),
    ("annotator null", '{"item": 1, "annotator": null, "label": "x"}\n', [], ["line 1, field 'annotator'"]),
    (
        "annotator empty",
        '{"item": 1, "annotator": " ", "label": "x"}\n',
        [],
        ["line 1, field 'annotator': must not be empty"],
    ),
    (
        "annotator types mixed",
        f'{GOOD}\n{{"item": 1, "annotator": 7, "label": "x"}}\n',
        [],
        ["line 2, field 'annotator'", "one kind of annotator"],
    ),
    (
        "duplicate judgement",
        f'{GOOD}\n{GOOD_B}\n{{"item": 1, "annotator": "A", "label": "y"}}\n',
        [],
        ["line 3, field 'annotator'", "already judged item 1", "line 1"],
    ),
    ("label null", '{"item": 1, "annotator": "A", "label": null}\n', [], ["line 1, field 'label'", "null"]),
    (
        "label a boolean",
        f'{GOOD}\n{{"item": 2, "annotator": "A", "label": true}}\n',
        [],
        ["line 2, field 'label'", "a boolean"],
    ),
    ("label an object", '{"item": 1, "annotator": "A", "label": {"v": 1}}\n', [], ["line 1, field 'label'"]),
    ("label NaN", '{"item": 1, "annotator": "A", "label": NaN}\n', [], ["line 1, field 'label'", "finite"]),
    (
        "nominal kinds mixed",
        f'{GOOD}\n{{"item": 1, "annotator": "B", "label": 3}}\n',
        [],
        ["line 2, field 'label'", "one kind of label"],
    ),
    (
        "ordinal string",
        '{"item": 1, "annotator": "A", "label": 2}\n{"item": 1, "annotator": "B", "label": "3"}\n',
        ["--level", "ordinal"],
        ["line 2, field 'label': the ordinal level needs a number"],
    ),
    (
        "interval list",
        '{"item": 1, "annotator": "A", "label": [1]}\n',
        ["--level", "interval"],
        ["line 1, field 'label': the interval level needs a number"],
    ),
    (
        "ratio negative",
        '{"item": 1, "annotator": "A", "label": 2}\n{"item": 1, "annotator": "B", "label": -1}\n',
        ["--level", "ratio"],
        ["line 2, field 'label'", "non-negative"],
    ),
    (
        "not in categories",
        '{"item": 1, "annotator": "A", "label": 2}\n{"item": 1, "annotator": "B", "label": 6}\n',
        ["--level", "ordinal", "--categories", "1,2,3,4,5"],
        ["line 2, field 'label'", "not one of --categories"],
    ),
    (
        "categories not numbers",
        '{"item": 1, "annotator": "A", "label": 2}\n',
        ["--categories", "low,high"],
        ["line 1, field 'label'", "not all numbers"],
    ),
    (
        "validity unknown flag",
        '{"item": 1, "annotator": "A", "label": "VALIDATED"}\n'
        '{"item": 1, "annotator": "B", "label": ["QUERY_TOO_BROAD", "INVALID_CAPTION"]}\n',
        ["--rubric", "validity"],
        ["line 2, field 'label'", "unknown flag 'INVALID_CAPTION'"],
    ),
    (
        "validity other string",
        '{"item": 1, "annotator": "A", "label": "VALID"}\n',
        ["--rubric", "validity"],
        ["line 1, field 'label'", "'VALIDATED' or a list of flags"],
    ),
    (
        "validity number",
        '{"item": 1, "annotator": "A", "label": 1}\n',
        ["--rubric", "validity"],
        ["line 1, field 'label'"],
    ),
    (
        "validity flag not a string",
        '{"item": 1, "annotator": "A", "label": [1]}\n',
        ["--rubric", "validity"],
        ["line 1, field 'label'", "flag must be a non-empty string"],
    ),
    ("empty file", "", [], ["no judgements"]),
    ("blank lines only", "\n  \n\n", [], ["no judgements"]),
]


@pytest.mark.parametrize(("name", "text", "args", "fragments"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_is_rejected(tmp_path, name, text, args, fragments) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CommandError) as info:
        run_json(str(path), *args)
    message = str(info.value)
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_blank_lines_and_extra_keys_are_accepted(tmp_path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(
        f'\n{GOOD}\n\n{{"item": 1, "annotator": "B", "label": "x", "note": "n"}}\n'
        '{"item": 2, "annotator": "A", "label": "y"}\n{"item": 2, "annotator": "B", "label": "x"}\n'
        '{"item": 3, "annotator": "A", "label": "y"}\n{"item": 3, "annotator": "B", "label": "y"}\n\n'
    )
    report = run_json(str(path), "--bootstrap", "0")
    assert (report["n_items"], report["n_judgements"]) == (3, 6)
    assert report["percent_agreement"] == pytest.approx(2 / 3, abs=1e-15)
    # A: x y y, B: x x y. p_o = 2/3, p_e = 1/3 * 2/3 + 2/3 * 1/3 = 4/9, kappa = (2/9) / (5/9) = 2/5.
    assert report["pairwise_cohen"]["by_pair"]["A__B"] == pytest.approx(2 / 5, abs=1e-15)


def test_nominal_flag_lists_become_sorted_signatures(tmp_path) -> None:
    records = [
        {"item": 1, "annotator": "A", "label": ["b", "a"]},
        {"item": 1, "annotator": "B", "label": ["a", "b"]},
        {"item": 2, "annotator": "A", "label": []},
        {"item": 2, "annotator": "B", "label": ["a"]},
    ]
    report = run_json(str(write_jsonl(tmp_path / "flags.jsonl", records)), "--bootstrap", "0")
    assert report["label_prevalence"] == pytest.approx({"": 0.25, "a": 0.25, "a+b": 0.5})
    assert report["percent_agreement"] == pytest.approx(0.5, abs=1e-15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "either an INPUT file or --study"),
        (["x.jsonl", "--study", "3"], "either an INPUT file or --study"),
        (["{file}", "--rubric", "validity", "--level", "ordinal"], "validity rubric is nominal"),
        (["{file}", "--bootstrap", "-1"], "--bootstrap must be 0 or more"),
        (["{file}", "--level", "interval", "--categories", "a,b"], "needs numbers"),
        (["{file}", "--categories", "a,,b"], "empty category"),
        (["{file}", "--categories", "a,b,a"], "duplicate category"),
        (["{file}", "--rubric", "validity", "--categories", "a,b"], "does not apply"),
        (["{missing}"], "no such file"),
    ],
)
def test_option_errors(tmp_path, args, message) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [{"item": 1, "annotator": "A", "label": "VALIDATED"}])
    args = [a.format(file=good, missing=tmp_path / "absent.jsonl") for a in args]
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run_json(*args)


# --------------------------------------------------------------------------- constant pairs


def test_constant_pairs_undefined_by_default(circus_file) -> None:
    """INVALID_IMAGE_QUERY: 28 of the 36 CIRCUS pairs are constant on 0 (undefined kappa): by
    default they are left out of the mean, which says it covers 8 pairs; with --constant-pairs
    one they count as 1.0 (the published mean)."""
    default = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "0")
    one = run_json(str(circus_file), "--rubric", "validity", "--bootstrap", "0", "--constant-pairs", "one")
    d = default["per_flag_agreement"]["INVALID_IMAGE_QUERY"]["pairwise_cohen"]
    o = one["per_flag_agreement"]["INVALID_IMAGE_QUERY"]["pairwise_cohen"]
    assert (d["count"], d["n_undefined"], d["n_pairs"], d["constant_pairs"]) == (8, 28, 36, "undefined")
    assert d["mean"] == 0.0 and o["mean"] == pytest.approx(28 / 36) and o["count"] == 36
    by_pair = default["per_flag_agreement"]["INVALID_IMAGE_QUERY"]["pairwise_cohen_by_pair"]
    assert sum(v is None for v in by_pair.values()) == 28
    assert "per_flag_agreement.INVALID_IMAGE_QUERY.pairwise_cohen.by_pair" in default["undefined"]
    out = StringIO()
    call_command(
        "agreement", str(circus_file), "--rubric", "validity", "--bootstrap", "0", stdout=out, stderr=StringIO()
    )
    assert "constant pairs: undefined" in out.getvalue()


# --------------------------------------------------------------------------- a real process


def test_exit_status_of_a_real_process(tmp_path, circus_file) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"item": 1, "annotator": "A", "label": "VALIDATED"}\n'
        '{"item": 1, "annotator": "B", "label": ["QUERY_TOO_BROAD"]}\n'
        '{"item": 2, "annotator": "A", "label": ["NOT_A_FLAG"]}\n'
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    cmd = [sys.executable, "manage.py", "agreement", "--rubric", "validity", "--format", "json"]
    failed = subprocess.run([*cmd, str(bad)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0
    assert f"{bad}, line 3, field 'label'" in failed.stderr and "NOT_A_FLAG" in failed.stderr
    assert failed.stdout == ""
    ok = subprocess.run(
        [*cmd, "--bootstrap", "0", str(circus_file)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["n_judgements"] == 450
