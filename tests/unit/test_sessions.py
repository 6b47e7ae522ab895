"""retrieval.sessions: aggregation, session metrics and filters, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from retrieval.sessions import (
    aggregate_history,
    apply_filters,
    curve_auc,
    curve_mean,
    epsilon_consistent,
    final_recall_at_k,
    first_hit_turn,
    history_weights,
    hits_at_k_curve,
    max_pairwise_cosine,
    passes_multi_turn,
    passes_success,
    passes_tau_diversity,
    session_metrics,
)

# ----------------------------------------------------------------- aggregation

TURNS = [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]


def test_latest_aggregation():
    out = aggregate_history(np.array([[3.0, 0.0], [0.0, 2.0]]), "latest")
    np.testing.assert_allclose(out, [[1.0, 0.0], [0.0, 1.0]])


def test_average_aggregation_by_hand():
    out = aggregate_history(np.array(TURNS), "average")
    s2, s5 = math.sqrt(2), math.sqrt(5)
    np.testing.assert_allclose(out, [[1, 0], [1 / s2, 1 / s2], [1 / s5, 2 / s5]])


def test_weighted_aggregation_by_hand():
    out = aggregate_history(np.array(TURNS), "weighted")  # alpha = 0.8
    # turn 2: 0.8*q1 + q2 = (0.8, 1); turn 3: 0.64*q1 + 0.8*q2 + q3 = (0.64, 1.8)
    n2, n3 = math.hypot(0.8, 1.0), math.hypot(0.64, 1.8)
    np.testing.assert_allclose(out, [[1, 0], [0.8 / n2, 1 / n2], [0.64 / n3, 1.8 / n3]])
    # alpha = 0.5: turn 3 = (0.25, 0.5 + 1) -> direction (1, 6)
    out_half = aggregate_history(np.array(TURNS), "weighted", 0.5)
    np.testing.assert_allclose(out_half[2], np.array([1.0, 6.0]) / math.sqrt(37))


def test_weights_are_normalised_rows():
    w = history_weights(3, "weighted", 0.8)
    np.testing.assert_allclose(w[2], np.array([0.64, 0.8, 1.0]) / 2.44)
    np.testing.assert_allclose(history_weights(3, "average")[1], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(history_weights(2, "latest"), np.eye(2))
    for strategy in ("latest", "average", "weighted"):
        np.testing.assert_allclose(history_weights(4, strategy).sum(axis=1), 1.0)
    with pytest.raises(ValueError):
        history_weights(2, "median")


def test_torch_input_keeps_type_dtype_and_matches_numpy():
    x = torch.tensor(TURNS, dtype=torch.float16)
    out = aggregate_history(x, "average")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    ref = aggregate_history(np.array(TURNS), "average")
    np.testing.assert_allclose(out.float().numpy(), ref, atol=1e-3)
    out32 = aggregate_history(torch.tensor(TURNS), "weighted")
    np.testing.assert_allclose(out32.numpy(), aggregate_history(np.array(TURNS), "weighted"), atol=1e-6)


def test_zero_aggregate_stays_zero():
    out = aggregate_history(np.array([[1.0, 0.0], [-1.0, 0.0]]), "average")
    np.testing.assert_allclose(out, [[1.0, 0.0], [0.0, 0.0]])


# ----------------------------------------------------------------- metrics

SESSIONS = {
    "a": [50, 12, 3],  # first hit at turn 3
    "b": [5],  # hit at turn 1, one turn only
    "c": [20, 10],  # rank == K at turn 2 -> hit
    "d": [11, None, 40, 11],  # K + 1 is a miss; never solved
}


def test_hits_curve_with_carry_forward():
    # L_max = 4; first hits: a 3, b 1, c 2, d never
    assert hits_at_k_curve(SESSIONS, k=10) == [0.25, 0.5, 0.75, 0.75]
    assert first_hit_turn([20, 10], 10) == 2
    assert first_hit_turn([11, None], 10) is None


def test_hits_are_sticky_but_final_recall_is_not():
    sessions = {"e": [3, 40], "f": [40, 40]}
    assert hits_at_k_curve(sessions) == [0.5, 0.5]
    assert final_recall_at_k(sessions) == 0.0


def test_final_recall():
    assert final_recall_at_k(SESSIONS, k=10) == 0.75
    assert final_recall_at_k(SESSIONS, k=11) == 1.0
    assert final_recall_at_k({}) is None


def test_auc_by_hand_for_lmax_1_2_3():
    # L_max = 1: AUC = Hits(1)
    one = {"x": [1], "y": [20]}
    assert hits_at_k_curve(one) == [0.5]
    assert session_metrics(one)["auc"] == 0.5
    # L_max = 2: hits [0, 0.5] -> (0 + 0.5) / 2 / 1
    two = {"x": [20, 1], "y": [20, 20]}
    assert hits_at_k_curve(two) == [0.0, 0.5]
    assert session_metrics(two)["auc"] == pytest.approx(0.25)
    # L_max = 3: hits [1/3, 2/3, 1] -> ((1/3+2/3)/2 + (2/3+1)/2) / 2 = 2/3
    three = {"x": [1, 30, 30], "y": [20, 5], "z": [50, 40, 2]}
    assert hits_at_k_curve(three) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert session_metrics(three)["auc"] == pytest.approx(2 / 3)
    # the mixed-length example: ((.25+.5)/2 + (.5+.75)/2 + (.75+.75)/2) / 3
    assert curve_auc([0.25, 0.5, 0.75, 0.75]) == pytest.approx(1.75 / 3)
    assert curve_auc([]) is None


def test_curve_mean_is_circled_codes_auc():
    """CIRCLED's print_statistics: AUC = (1/T) sum_t H(t), unit spacing, no trapezoid."""
    assert curve_mean([0.25, 0.5, 0.75, 0.75]) == pytest.approx(2.25 / 4)
    assert curve_mean([0.5]) == 0.5 == curve_auc([0.5])
    assert curve_mean([0.005, 0.015, 0.015, 0.015]) == pytest.approx(0.0125)  # trapezoid: 0.01333
    assert curve_auc([0.005, 0.015, 0.015, 0.015]) == pytest.approx(0.04 / 3)
    assert curve_mean([]) is None


def test_epsilon_consistency_boundary():
    assert epsilon_consistent([10, 40], epsilon=30) is True  # worse by exactly epsilon
    assert epsilon_consistent([10, 41], epsilon=30) is False  # epsilon + 1
    assert epsilon_consistent([100, 1, 31]) is True
    assert epsilon_consistent([100, 1, 32]) is False
    assert epsilon_consistent([1, 31, 61]) is True  # consecutive pairs only
    assert epsilon_consistent([7]) is True


def test_epsilon_consistency_with_missing_ranks():
    assert epsilon_consistent([5, None]) is False  # rank -> not retrieved
    assert epsilon_consistent([None, None]) is True
    assert epsilon_consistent([None, 500]) is True
    assert epsilon_consistent([None, 500, 531]) is False


def test_session_metrics_exact_dict():
    assert session_metrics(SESSIONS, k=10, epsilon=30) == {
        "n_sessions": 4,
        "hits_at_k": [0.25, 0.5, 0.75, 0.75],
        "final_recall_at_k": 0.75,
        "auc": pytest.approx(1.75 / 3),
        "epsilon_consistent": 3,
        "epsilon_violations": ["d"],
    }
    # z: 1 -> 40 (+39) and x: 5 -> 36 (+31) violate; ids follow the input order
    ordered = session_metrics({"z": [1, 40], "y": [1, 31], "x": [5, 36]}, epsilon=30)
    assert ordered["epsilon_violations"] == ["z", "x"]
    assert ordered["epsilon_consistent"] == 1


def test_session_metrics_empty_and_invalid():
    assert session_metrics({}) == {
        "n_sessions": 0,
        "hits_at_k": [],
        "final_recall_at_k": None,
        "auc": None,
        "epsilon_consistent": 0,
        "epsilon_violations": [],
    }
    with pytest.raises(ValueError):
        session_metrics({"s": []})
    with pytest.raises(ValueError):
        session_metrics({"s": [0, 3]})


# ----------------------------------------------------------------- filters

FILTER_SESSIONS = {
    "s1": [5, 3],  # solved at turn 1 -> multi-turn removes it
    "s2": [20, 8],  # kept
    "s3": [20, 30],  # never within K -> success removes it
    "s4": [15, 50, 9],  # +35 -> epsilon removes it
    "s5": [40, 70, 2],  # +30 exactly passes epsilon; tau removes it
    "s6": [12, None, 4],  # rank -> None -> epsilon removes it
    "s7": [None, 1],  # kept
}
TEXTS = {
    "s1": np.array([[1, 0], [2, 0]]),  # cosine 1
    "s2": np.array([[1, 0], [0, 1]]),
    "s3": np.array([[1, 0]]),
    "s4": np.array([[1, 0], [0, 1]]),
    "s5": np.array([[1, 0], [0, 5], [4, 3]]),  # cosine 4/5 = tau exactly -> removed
    "s6": np.array([[1, 0], [0, 1]]),
    "s7": torch.tensor([[1.0, 0.0], [3.0, 4.0]]),  # cosine 0.6
}


def test_filter_predicates():
    assert passes_success([20, 10]) and not passes_success([11, None])
    assert passes_multi_turn([11, 3]) and not passes_multi_turn([10, 3])
    assert passes_multi_turn([None, 1])
    assert max_pairwise_cosine(TEXTS["s5"]) == pytest.approx(0.8)
    assert not passes_tau_diversity(TEXTS["s5"], tau=0.8)
    assert passes_tau_diversity(TEXTS["s5"], tau=0.81)
    assert passes_tau_diversity(TEXTS["s3"]) and max_pairwise_cosine(TEXTS["s3"]) is None


def test_filter_chain_counts():
    report = apply_filters(FILTER_SESSIONS, TEXTS, k=10, epsilon=30, tau=0.8)
    steps = {s.name: s for s in report.steps}
    assert [s.name for s in report.steps] == [
        "success",
        "multi_turn",
        "epsilon_consistency",
        "tau_diversity",
    ]
    assert (steps["success"].removed, steps["success"].removed_ids) == (1, ["s3"])
    assert (steps["multi_turn"].removed, steps["multi_turn"].removed_ids) == (1, ["s1"])
    assert steps["epsilon_consistency"].removed_ids == ["s4", "s6"]
    assert steps["tau_diversity"].removed_ids == ["s5"]
    assert [s.remaining for s in report.steps] == [6, 5, 3, 2]
    # each filter alone on all seven sessions
    assert [s.removed_alone for s in report.steps] == [1, 1, 2, 2]
    assert report.kept == ["s2", "s7"]
    assert report.as_dict()["n_kept"] == 2


def test_filter_chain_without_text_embeddings_skips_tau():
    report = apply_filters(FILTER_SESSIONS)
    assert report.steps[-1].skipped and report.steps[-1].removed == 0
    assert report.kept == ["s2", "s5", "s7"]
    with pytest.raises(KeyError):
        apply_filters(FILTER_SESSIONS, {"s1": TEXTS["s1"]})
