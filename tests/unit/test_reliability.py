"""Dawid-Skene (annotation.verdicts.reliability) against crowd-kit's DawidSkene, the
reference implementation, on a simulated crowd with known confusion matrices and a spammer;
the binary model and the per-annotator intervals."""

from __future__ import annotations

import numpy as np
import pytest

from annotation.core.consensus import Vote, decide
from annotation.verdicts.reliability import (
    Reliability,
    annotator_reliability,
    beta_interval,
    dawid_skene,
    fit_votes,
)


def simulated(n_items=300, seed=3, classes=(False, True)):
    """(rows, truth): 5 annotators (accuracies 0.9 .. 0.65, one skewed) and a spammer who
    answers at random; 3 to 5 answers per item."""
    rng = np.random.default_rng(seed)
    truth = {f"t{i}": classes[int(rng.random() < 0.35)] for i in range(n_items)}
    acc = {"a": 0.92, "b": 0.85, "c": 0.78, "d": 0.7, "e": 0.65, "spam": None}
    rows = []
    for item, z in truth.items():
        for w in rng.choice(list(acc), size=int(rng.integers(3, 6)), replace=False):
            if acc[w] is None:
                label = classes[int(rng.integers(len(classes)))]
            elif w == "e" and z == classes[0]:  # skewed: often says the second class
                label = classes[1] if rng.random() < 0.5 else z
            else:
                label = z if rng.random() < acc[w] else classes[int(rng.integers(len(classes)))]
            rows.append((item, str(w), label))
    return rows, truth


def votes_by_item(rows) -> dict:
    """The simulated answers as consensus votes per item (what fit_votes reads)."""
    by_item: dict = {}
    for item, w, label in rows:
        by_item.setdefault(item, []).append(Vote(w, label))
    return by_item


def crowdkit_fit(rows):
    # The reference is required, never skipped: ./cirval installs it (requirements-reference.txt),
    # and a run without it must fail rather than leave Dawid-Skene unchecked.
    import crowdkit.aggregation as ck
    import pandas as pd

    df = pd.DataFrame(rows, columns=["task", "worker", "label"])
    return ck.DawidSkene(n_iter=100, tol=1e-5).fit(df)


@pytest.mark.parametrize("classes", [(False, True), ("a", "b", "c")])
def test_dawid_skene_equals_crowdkit(classes):
    rows, truth = simulated(classes=classes)
    ours = dawid_skene(rows)
    ref = crowdkit_fit(rows)
    labels = ours.labels()
    assert labels == {t: ref.labels_[t] for t in labels}
    assert len(ref.loss_history_) == ours.iterations
    priors = ref.priors_.to_dict()
    for c, p in zip(ours.classes, ours.priors):
        assert p == pytest.approx(float(priors[c]), abs=1e-6)
    probas = ref.probas_.to_dict("index")  # item -> {class: p}
    for n, item in enumerate(ours.items):
        for c_i, c in enumerate(ours.classes):
            assert ours.posteriors[n, c_i] == pytest.approx(float(probas[item][c]), abs=1e-6)
    errors = ref.errors_.to_dict("index")  # (worker, said) -> {truth: p}
    for w_i, w in enumerate(ours.workers):
        for k_i, k in enumerate(ours.classes):
            for c_i, c in enumerate(ours.classes):
                expected = float(errors[(w, k)][c]) if (w, k) in errors else 0.0
                assert ours.errors[w_i, k_i, c_i] == pytest.approx(expected, abs=1e-6)
    # and the model is right: it recovers the truth better than the spammer's coin
    assert sum(labels[t] == z for t, z in truth.items()) / len(truth) > 0.9


def test_reliability_ranks_the_spammer_last_with_intervals():
    rows, _ = simulated()
    fit = dawid_skene(rows)
    table = {r.annotator: r for r in annotator_reliability(fit, rows)}
    assert min(table, key=lambda w: table[w].accuracy) == "spam"
    assert table["a"].accuracy > table["d"].accuracy
    for r in table.values():
        assert 0 <= r.low < r.accuracy < r.high <= 1
        assert r.sensitivity is not None and r.specificity is not None
    assert table["spam"].high < table["a"].low  # the intervals tell them apart


def test_beta_interval_known_values():
    low, high = beta_interval(0, 0)  # Beta(1, 1): uniform
    assert (low, high) == pytest.approx((0.025, 0.975))
    low, high = beta_interval(9, 1)  # Beta(10, 2)
    assert low == pytest.approx(0.587, abs=1e-3) and high == pytest.approx(0.977, abs=1e-3)


def test_weighted_consensus_lets_a_reliable_annotator_outweigh_two_unreliable_ones():
    model = Reliability(
        prior=0.5, sensitivity={"good": 0.95, "x": 0.55, "y": 0.55}, specificity={"good": 0.95, "x": 0.55, "y": 0.55}
    )
    votes = [Vote("good", True), Vote("x", False), Vote("y", False)]
    assert decide(votes, "majority", quorum=3).status == "rejected"
    weighted = decide(votes, "reliability", quorum=3, reliability=model)
    assert (weighted.status, weighted.provenance) == ("validated", "reliability")
    # unanimous votes decide as under majority; no model: majority
    assert decide(votes[1:], "reliability", quorum=2, reliability=model).provenance == "unanimous"
    assert decide(votes, "reliability", quorum=3).status == "rejected"
    # an unknown annotator adds nothing: the prior alone on a split of unknowns is a tie
    assert decide([Vote("p", True), Vote("q", False)], "reliability", quorum=2, reliability=model).reason == "tie"


def test_fit_votes_gives_the_binary_model():
    rows, truth = simulated()
    fit, model = fit_votes(votes_by_item(rows))
    assert model.sensitivity["a"] > 0.85 and model.specificity["a"] > 0.85
    assert 0.45 < model.sensitivity["spam"] < 0.75
    assert model.prior == pytest.approx(sum(truth.values()) / len(truth), abs=0.06)
    assert dawid_skene([]).items == ()


def test_the_binary_model_is_smoothed_so_a_handful_of_votes_settles_nothing():
    from annotation.core.consensus import confident
    from annotation.verdicts.reliability import SMOOTHING

    # a first fit on five votes, all "valid": the raw fit's prior is 1 and every rate 1 or missing
    few = {f"i{n}": [Vote(w, True)] for n, w in enumerate("abcab")}
    fit, model = fit_votes(few)
    assert fit.priors[list(fit.classes).index(True)] == 1.0
    assert model.prior == pytest.approx((5 + SMOOTHING) / (5 + 2 * SMOOTHING))
    assert model.sensitivity["a"] == pytest.approx((2 + SMOOTHING) / (2 + 2 * SMOOTHING))
    assert model.specificity["a"] == 0.5  # no mass on invalid items: nothing known
    split = [Vote("a", True), Vote("b", False)]
    assert not confident(model.posterior(split), 0.9)  # a split still needs a third annotator


def test_smoothing_bounds_the_rates_and_vanishes_with_many_answers():
    rows, _ = simulated()
    fit, model = fit_votes(votes_by_item(rows))
    t, f = fit.classes.index(True), fit.classes.index(False)
    for n, w in enumerate(fit.workers):
        seen_valid, seen_invalid = fit.masses[n, :, t].sum(), fit.masses[n, :, f].sum()
        assert fit.masses[n].sum() == pytest.approx(sum(1 for r in rows if r[1] == w))
        assert 0.0 < model.sensitivity[w] < 1.0 and 0.0 < model.specificity[w] < 1.0
        # within one pseudo-answer of the raw fit's rate per answer seen
        assert abs(model.sensitivity[w] - fit.errors[n, t, t]) <= 1.0 / seen_valid
        assert abs(model.specificity[w] - fit.errors[n, f, f]) <= 1.0 / seen_invalid
    raw = Reliability.from_fit(fit, smoothing=0.0)
    assert raw.sensitivity["a"] == pytest.approx(float(fit.errors[fit.workers.index("a"), t, t]))
    assert raw.prior == pytest.approx(float(fit.priors[t]))
