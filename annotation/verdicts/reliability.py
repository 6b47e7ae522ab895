"""Annotator reliability: Dawid-Skene, per-annotator reliability with intervals, and the
posterior that reliability-weighted consensus decides by (pure: numpy and scipy, no Django).

:func:`dawid_skene` is the EM of Dawid & Skene (1979, "Maximum likelihood estimation of
observer error-rates using the EM algorithm", Applied Statistics 28:20-28), written to
follow the well-kept reference implementation, crowd-kit's ``DawidSkene`` (1.4), step for
step, so the two give the same labels, priors and confusion matrices (the unit tests
compare them on a simulated crowd):

* start from the majority vote's label shares of each item;
* M-step: each annotator's confusion ``errors[w, k, c] = P(says k | truth c)`` is the
  posterior mass of their answers, floored at 1e-10 where they gave that answer, normalised
  over their answers; the prior is the mean posterior;
* E-step: the posterior of each item is the prior times the confusion entries of its answers;
* stop after ``n_iter`` rounds or once the evidence lower bound per answer grows by less
  than ``tol``.

:class:`Reliability` is the binary (valid / invalid) model consensus reads
(:func:`annotation.core.consensus.decide`, policy ``"reliability"``): the prior that an
item is valid and each annotator's sensitivity (P(says valid | valid)) and specificity
(P(says invalid | invalid)). :func:`annotator_reliability` gives each annotator's expected
accuracy under the fitted posteriors with a 95% Beta interval (the Jeffreys-like
``Beta(1 + correct, 1 + wrong)`` of their expected correct and wrong answers).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-10  # crowd-kit's floor of probabilities (priors, confusion entries)


@dataclass(frozen=True)
class DawidSkeneFit:
    """The fitted model. ``classes``: the labels (sorted); ``items`` / ``workers``: in order of
    first appearance; ``posteriors[i, c]``: P(item i is class c); ``priors[c]``;
    ``errors[w, k, c]``: P(worker w answers k | truth c) (0 where w never answered k);
    ``masses[w, k, c]``: the soft count behind it (w's answers k weighted by P(truth c))."""

    classes: tuple
    items: tuple
    workers: tuple
    posteriors: np.ndarray
    priors: np.ndarray
    errors: np.ndarray
    iterations: int
    masses: np.ndarray

    def labels(self) -> dict:
        """The most probable class of each item (the first class on an exact tie)."""
        best = self.posteriors.argmax(axis=1)
        return {item: self.classes[int(c)] for item, c in zip(self.items, best)}

    def posterior(self, item: Hashable) -> dict:
        row = self.posteriors[self.items.index(item)]
        return {c: float(p) for c, p in zip(self.classes, row)}


def _index(rows: Sequence[tuple[Hashable, Hashable, Hashable]]) -> tuple[tuple, tuple, tuple, np.ndarray]:
    items = tuple(dict.fromkeys(r[0] for r in rows))
    workers = tuple(dict.fromkeys(r[1] for r in rows))
    classes = tuple(sorted(set(r[2] for r in rows)))
    ii = {x: n for n, x in enumerate(items)}
    wi = {x: n for n, x in enumerate(workers)}
    ci = {x: n for n, x in enumerate(classes)}
    coded = np.array([(ii[t], wi[w], ci[k]) for t, w, k in rows], dtype=np.int64).reshape(-1, 3)
    return items, workers, classes, coded


def _m_step(coded: np.ndarray, probas: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    n_workers, k = shape
    errors = np.zeros((n_workers, k, k))
    np.add.at(errors, (coded[:, 1], coded[:, 2]), probas[coded[:, 0]])
    seen = np.zeros((n_workers, k), dtype=bool)
    seen[coded[:, 1], coded[:, 2]] = True
    errors = np.where(seen[:, :, None], np.maximum(errors, EPS), 0.0)
    return errors / errors.sum(axis=1, keepdims=True)


def _log_joint(coded: np.ndarray, priors: np.ndarray, errors: np.ndarray, n_items: int) -> np.ndarray:
    """log P(truth c, answers of item i) for every item and class."""
    with np.errstate(divide="ignore"):
        log_err = np.log(errors)
    joint = np.zeros((n_items, priors.size))
    np.add.at(joint, coded[:, 0], log_err[coded[:, 1], coded[:, 2]])
    return joint + np.log(np.maximum(priors, EPS))


def _e_step(coded: np.ndarray, priors: np.ndarray, errors: np.ndarray, n_items: int) -> np.ndarray:
    joint = _log_joint(coded, priors, errors, n_items)
    scaled = np.exp(joint - joint.max(axis=1, keepdims=True))
    return scaled / scaled.sum(axis=1, keepdims=True)


def _elbo(coded: np.ndarray, probas: np.ndarray, priors: np.ndarray, errors: np.ndarray) -> float:
    with np.errstate(divide="ignore"):
        log_err = np.log(errors)
    per_answer = log_err[coded[:, 1], coded[:, 2]] + np.log(np.maximum(priors, EPS))
    expectation = float((probas[coded[:, 0]] * per_answer).sum())
    clipped = np.maximum(probas, EPS)
    return expectation - float((np.log(clipped) * clipped).sum())


def majority_shares(coded: np.ndarray, n_items: int, k: int) -> np.ndarray:
    """Each item's share of answers per class (the majority vote's probabilities)."""
    counts = np.zeros((n_items, k))
    np.add.at(counts, (coded[:, 0], coded[:, 2]), 1.0)
    return counts / counts.sum(axis=1, keepdims=True)


def dawid_skene(
    rows: Iterable[tuple[Hashable, Hashable, Hashable]], n_iter: int = 100, tol: float = 1e-5
) -> DawidSkeneFit:
    """Fit Dawid-Skene to ``(item, worker, label)`` answers (one per item and worker)."""
    rows = list(rows)
    items, workers, classes, coded = _index(rows)
    if not rows:
        return DawidSkeneFit((), (), (), np.zeros((0, 0)), np.zeros(0), np.zeros((0, 0, 0)), 0, np.zeros((0, 0, 0)))
    k, n_items = len(classes), len(items)
    probas = majority_shares(coded, n_items, k)
    priors = probas.mean(axis=0)
    errors = _m_step(coded, probas, (len(workers), k))
    loss, rounds = -np.inf, 0
    for rounds in range(1, n_iter + 1):  # noqa: B007 - read after the loop: the rounds run
        probas = _e_step(coded, priors, errors, n_items)
        priors = probas.mean(axis=0)
        errors = _m_step(coded, probas, (len(workers), k))
        new_loss = _elbo(coded, probas, priors, errors) / len(rows)
        if new_loss - loss < tol:
            break
        loss = new_loss
    masses = np.zeros((len(workers), k, k))
    np.add.at(masses, (coded[:, 1], coded[:, 2]), probas[coded[:, 0]])
    return DawidSkeneFit(classes, items, workers, probas, priors, errors, rounds, masses)


# ----------------------------------------------------------------- the binary model of consensus

#: Pseudo-answers, one right and one wrong per annotator and true class (and one valid and one
#: invalid item for the prior), added to a fit's soft counts when consensus reads it (Laplace's
#: rule of succession). Without them a fit on a handful of votes has rates of exactly 0 or 1
#: (or a prior of 1 when every early vote said valid), so one vote, or the prior alone, would
#: settle a split: serving then closed splits that the next fit reopened after their annotators
#: had been told "nothing left", and a vote of an annotator fitted at 1.000 outweighed two others.
SMOOTHING = 1.0


@dataclass(frozen=True)
class Reliability:
    """What reliability-weighted consensus knows of a study's annotators: ``prior`` (P(an item
    is valid)), and per annotator ``sensitivity`` (P(says valid | valid)) and ``specificity``
    (P(says invalid | invalid)). An annotator it does not know adds nothing to a posterior."""

    prior: float
    sensitivity: Mapping[str, float]
    specificity: Mapping[str, float]

    def posterior(self, votes: Iterable[object]) -> float:
        """P(valid | these votes): each vote has ``annotator`` and ``validated`` (a
        :class:`annotation.core.consensus.Vote`)."""
        log_valid = np.log(max(self.prior, EPS))
        log_invalid = np.log(max(1.0 - self.prior, EPS))
        for v in votes:
            name = v.annotator
            if name not in self.sensitivity:
                continue
            sens, spec = self.sensitivity[name], self.specificity[name]
            said_valid = bool(v.validated)
            log_valid += np.log(max(sens if said_valid else 1.0 - sens, EPS))
            log_invalid += np.log(max(1.0 - spec if said_valid else spec, EPS))
        top = max(log_valid, log_invalid)
        a, b = np.exp(log_valid - top), np.exp(log_invalid - top)
        return float(a / (a + b))

    @classmethod
    def from_fit(cls, fit: DawidSkeneFit, smoothing: float = SMOOTHING) -> Reliability:
        """The binary model of a fit whose labels are True (valid) / False, read off its soft
        counts with ``smoothing`` pseudo-answers (:data:`SMOOTHING`): each rate is
        ``(right + s) / (answers + 2 s)`` over the annotator's answers weighted by the fit's
        posteriors, the prior ``(valid + s) / (items + 2 s)``. A class nobody's answers put
        mass on gives 0.5 (nothing known)."""
        t = fit.classes.index(True) if True in fit.classes else None
        f = fit.classes.index(False) if False in fit.classes else None
        s = float(smoothing)
        valid = float(fit.posteriors[:, t].sum()) if t is not None and len(fit.items) else 0.0
        prior = (valid + s) / (len(fit.items) + 2 * s) if len(fit.items) + 2 * s > 0 else 0.5

        def rate(n: int, c: int | None) -> float:
            if c is None:
                return 0.5
            right, seen = float(fit.masses[n, c, c]), float(fit.masses[n, :, c].sum())
            return (right + s) / (seen + 2 * s) if seen + 2 * s > 0 else 0.5

        sens = {w: rate(n, t) for n, w in enumerate(fit.workers)}
        spec = {w: rate(n, f) for n, w in enumerate(fit.workers)}
        return cls(prior, sens, spec)

    def to_dict(self) -> dict:
        return {"prior": self.prior, "sensitivity": dict(self.sensitivity), "specificity": dict(self.specificity)}

    @classmethod
    def from_dict(cls, data: Mapping) -> Reliability:
        """The model :meth:`to_dict` wrote (a stored fit)."""
        return cls(float(data["prior"]), dict(data["sensitivity"]), dict(data["specificity"]))


def fit_votes(
    votes_by_item: Mapping[Hashable, Sequence[object]], n_iter: int = 100, tol: float = 1e-5
) -> tuple[DawidSkeneFit, Reliability]:
    """Dawid-Skene on consensus votes (``annotator``, ``validated``) of each item, and its binary model."""
    rows = [(item, v.annotator, bool(v.validated)) for item, votes in votes_by_item.items() for v in votes]
    fit = dawid_skene(rows, n_iter, tol)
    return fit, Reliability.from_fit(fit)


@dataclass(frozen=True)
class AnnotatorReliability:
    """One annotator's reliability: ``answers``; ``accuracy`` (expected share of answers that
    match the truth under the fitted posteriors) with its 95% interval ``low``-``high``;
    ``sensitivity`` / ``specificity`` (binary fits; ``None`` otherwise)."""

    annotator: str
    answers: int
    accuracy: float
    low: float
    high: float
    sensitivity: float | None = None
    specificity: float | None = None

    def to_dict(self) -> dict:
        return {
            "annotator": self.annotator,
            "answers": self.answers,
            "accuracy": self.accuracy,
            "low": self.low,
            "high": self.high,
            "sensitivity": self.sensitivity,
            "specificity": self.specificity,
        }


def beta_interval(correct: float, wrong: float, level: float = 0.95) -> tuple[float, float]:
    """The equal-tailed ``level`` interval of Beta(1 + correct, 1 + wrong): its quantiles, the
    inverse of the regularised incomplete beta function (what ``scipy.stats.beta.ppf``
    computes), imported here, where an interval is built: ``scipy.stats`` costs a process
    that reads no reliability (every worker and web process imports this module) about a
    second to import."""
    from scipy.special import betaincinv

    tail = (1.0 - level) / 2.0
    return (float(betaincinv(1 + correct, 1 + wrong, tail)), float(betaincinv(1 + correct, 1 + wrong, 1 - tail)))


def annotator_reliability(
    fit: DawidSkeneFit, rows: Iterable[tuple[Hashable, Hashable, Hashable]], level: float = 0.95
) -> list[AnnotatorReliability]:
    """Every annotator's reliability under ``fit`` (see :class:`AnnotatorReliability`), by name."""
    items = {x: n for n, x in enumerate(fit.items)}
    classes = {x: n for n, x in enumerate(fit.classes)}
    correct: dict = {}
    answers: dict = {}
    for item, worker, label in rows:
        p = float(fit.posteriors[items[item], classes[label]])
        correct[worker] = correct.get(worker, 0.0) + p
        answers[worker] = answers.get(worker, 0) + 1
    binary = Reliability.from_fit(fit) if set(fit.classes) == {True, False} else None
    out = []
    for worker in sorted(answers, key=str):
        n, c = answers[worker], correct[worker]
        low, high = beta_interval(c, n - c, level)
        out.append(
            AnnotatorReliability(
                str(worker),
                n,
                c / n,
                low,
                high,
                binary.sensitivity.get(worker) if binary else None,
                binary.specificity.get(worker) if binary else None,
            )
        )
    return out
