"""A simulated crowd on a known truth: what each labelling strategy costs in judgements and
what its validated set is worth (pure: no Django). ``bench/labour.py`` prints it on the demo
world's truth and ``manage.py demo_check`` reports it.

The simulation calls the app's own rules, never a copy: the study's quorum rule
(:func:`annotation.core.consensus.study_quorum_rule`: how many annotators an item is served to,
given its votes so far; :meth:`~annotation.core.consensus.AdaptiveQuorumRule.settled` says
whether an item needs another), consensus (:func:`annotation.core.consensus.decide`, with the
rule's ``needed`` as its quorum) and Dawid-Skene (:func:`annotation.verdicts.reliability.fit_votes`,
the model of the ``"reliability"`` policy).

Each annotator has a known confusion matrix: ``sensitivity`` (P(says valid | the item is
valid)) and ``specificity`` (P(says invalid | invalid)); a spammer answers valid or invalid
at random. An item is served to annotators drawn at random from the team (no one twice), one
at a time, while the rule's ``slots`` for its votes exceed the votes it has. Every strategy
sees the same crowd (the same order and answers per item and seed), so adaptive 2->3 with
majority decides every item exactly as fixed overlap 3 does: a third vote never overturns two
agreeing ones.

Adaptive overlap under reliability-weighted consensus reads the annotators' reliability as the
app does, from the judgements collected so far, never from the truth (:func:`collect`): items
arrive in batches of :data:`BATCH` (in a seeded order); each gets its base votes, Dawid-Skene is
fitted on every vote so far, and every item its rule does not find settled under that fit gets
a further annotator; once all items are in, fitting and topping up repeat until every item is
settled under the fit of all the votes, the fit consensus then decides by (the app likewise
serves by its last stored fit and refits in a worker every few judgements or seconds, reopening
the items the new fit leaves uncertain: :mod:`annotation.verdicts.refit`; an export refits first).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from annotation.core.consensus import DEFAULT_CONFIDENCE, VALIDATED, QuorumRule, Vote, decide, study_quorum_rule
from annotation.verdicts.reliability import Reliability, fit_votes
from retrieval.demo import HUMAN_EXPECTED


@dataclass(frozen=True)
class Annotator:
    name: str
    sensitivity: float  # P(says valid | valid)
    specificity: float  # P(says invalid | invalid)

    def answer(self, valid: bool, rng: random.Random) -> bool:
        right = rng.random() < (self.sensitivity if valid else self.specificity)
        return valid if right else not valid


#: The default team: seven annotators of known, differing quality (valid items are easier to
#: recognise than defects, as in the demo) and one spammer who answers at random.
TEAM: tuple[Annotator, ...] = (
    Annotator("ann_a", 0.97, 0.90),
    Annotator("ann_b", 0.96, 0.88),
    Annotator("ann_c", 0.95, 0.85),
    Annotator("ann_d", 0.94, 0.82),
    Annotator("ann_e", 0.93, 0.80),
    Annotator("ann_f", 0.92, 0.78),
    Annotator("ann_g", 0.90, 0.75),
    Annotator("spammer", 0.5, 0.5),
)


@dataclass(frozen=True)
class Strategy:
    """A labelling strategy: ``overlap`` and ``maximum`` (the study's quorum rule:
    adaptive when the maximum exceeds the overlap), the consensus ``policy`` and, under the
    ``"reliability"`` policy, the posterior that settles a split (``confidence``, the study's
    ``adaptive_confidence``)."""

    name: str
    overlap: int
    maximum: int | None
    policy: str  # "majority" or "reliability" (Dawid-Skene)
    confidence: float = DEFAULT_CONFIDENCE
    oracle: bool = False  # read the team's true confusion matrices instead of a fit (a bound, not a strategy)

    @property
    def rule(self) -> QuorumRule:
        """The study's quorum rule under these settings (``Study.quorum_rule``)."""
        return study_quorum_rule(self.overlap, None, self.maximum, self.policy, self.confidence)


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("fixed overlap 3, majority", 3, None, "majority"),
    Strategy("adaptive 2->3, majority", 2, 3, "majority"),
    Strategy("adaptive 2->3, Dawid-Skene", 2, 3, "reliability"),
)

#: Items per batch between two Dawid-Skene fits of the simulated reliability-weighted study.
BATCH = 10


@dataclass(frozen=True)
class Outcome:
    """One strategy's result: ``judgements`` spent; ``validated`` items and how many of them
    are truly valid (``validated_correct``); ``correct`` decisions among ``items`` (an
    undecided item counts as wrong); the truly valid items (``valid``)."""

    strategy: str
    items: int
    valid: int
    judgements: int
    validated: int
    validated_correct: int
    correct: int

    @property
    def validated_accuracy(self) -> float:
        """Share of the validated set that is truly valid (its precision)."""
        return self.validated_correct / self.validated if self.validated else 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.items if self.items else 0.0

    @property
    def valid_recall(self) -> float:
        return self.validated_correct / self.valid if self.valid else 0.0

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "items": self.items,
            "judgements": self.judgements,
            "validated": self.validated,
            "validated_accuracy": self.validated_accuracy,
            "accuracy": self.accuracy,
            "valid_recall": self.valid_recall,
        }


def answers(item: str, valid: bool, team: Sequence[Annotator], seed: int) -> list[Vote]:
    """The item's answers in serving order: the team shuffled and each member's answer, drawn
    from the item's own generator (seed and item), so that every strategy sees the same crowd
    (common random numbers: strategies differ by their rules, not by their luck)."""
    rng = random.Random(f"{seed}:{item}")
    return [Vote(a.name, a.answer(valid, rng)) for a in rng.sample(list(team), len(team))]


def true_reliability(truth: Mapping[str, bool], team: Sequence[Annotator]) -> Reliability:
    """The reliability model of the truth itself: the share of valid items and every annotator's
    true sensitivity and specificity (what a perfect Dawid-Skene fit would give)."""
    prior = sum(truth.values()) / len(truth) if truth else 0.5
    return Reliability(prior, {a.name: a.sensitivity for a in team}, {a.name: a.specificity for a in team})


def _model(votes: Mapping[str, list[Vote]], known: Reliability | None) -> Reliability:
    return known if known is not None else fit_votes(votes)[1]


def _top_up(votes: dict[str, list[Vote]], streams: Mapping[str, list[Vote]], rule: QuorumRule) -> bool:
    """Serve every item to further annotators while the rule's slots for its votes exceed them."""
    changed = False
    for item, got in votes.items():
        while len(got) < rule.slots(False, None, got):
            got.append(streams[item][len(got)])
            changed = True
    return changed


def collect(
    truth: Mapping[str, bool], strategy: Strategy, team: Sequence[Annotator], seed: int, batch: int = BATCH
) -> dict[str, list[Vote]]:
    """The votes each item gets under the strategy's quorum rule: served to one annotator
    after another (:func:`answers`' order, no one twice) while the rule's slots exceed its votes;
    a reliability-weighted rule reads Dawid-Skene on the votes so far (see the module docstring)."""
    rule = strategy.rule
    if rule.most > len(team):
        raise ValueError(f"a team of {len(team)} cannot give {rule.most} votes per item")
    streams = {item: answers(item, valid, team, seed) for item, valid in truth.items()}
    if not rule.weighted:
        votes: dict[str, list[Vote]] = {item: [] for item in truth}
        _top_up(votes, streams, rule)
        return votes
    known = true_reliability(truth, team) if strategy.oracle else None
    order = list(truth)
    random.Random(f"{seed}:order").shuffle(order)
    votes = {}
    for start in range(0, len(order), batch):
        for item in order[start : start + batch]:
            votes[item] = list(streams[item][: rule.slots()])
        _top_up(votes, streams, rule.with_reliability(_model(votes, known)))
    while _top_up(votes, streams, rule.with_reliability(_model(votes, known))):
        pass
    return {item: votes[item] for item in truth}


def decide_all(
    votes: Mapping[str, list[Vote]], strategy: Strategy, known: Reliability | None = None
) -> dict[str, bool | None]:
    """Each item's verdict (True validated, False rejected, None undecided) under the
    strategy's consensus, with its quorum rule's ``needed`` as the quorum (the rule and the
    policy read the same Dawid-Skene fit of all the votes; ``known``: the oracle's model)."""
    model = _model(votes, known) if strategy.policy == "reliability" else None
    rule = strategy.rule.with_reliability(model)
    out: dict[str, bool | None] = {}
    for item, got in votes.items():
        d = decide(got, strategy.policy, quorum=rule.needed(got), reliability=model)
        out[item] = (d.status == VALIDATED) if d.decided else None
    return out


def run_strategy(
    truth: Mapping[str, bool], strategy: Strategy, team: Sequence[Annotator] = TEAM, seed: int = 0
) -> Outcome:
    """One simulated study of the strategy on ``truth`` (item -> truly valid)."""
    votes = collect(truth, strategy, team, seed)
    verdicts = decide_all(votes, strategy, true_reliability(truth, team) if strategy.oracle else None)
    validated = [i for i, v in verdicts.items() if v]
    return Outcome(
        strategy.name,
        len(truth),
        sum(truth.values()),
        sum(len(v) for v in votes.values()),
        len(validated),
        sum(truth[i] for i in validated),
        sum(verdicts[i] is not None and verdicts[i] == truth[i] for i in truth),
    )


def compare(
    truth: Mapping[str, bool],
    strategies: Sequence[Strategy] = STRATEGIES,
    team: Sequence[Annotator] = TEAM,
    repeats: int = 20,
    seed: int = 0,
) -> list[Outcome]:
    """Each strategy over ``repeats`` simulated crowds (the same seeds for every strategy),
    summed: accuracies are pooled over the repeats."""
    pooled = []
    for s in strategies:
        runs = [run_strategy(truth, s, team, seed + r) for r in range(repeats)]
        pooled.append(
            Outcome(
                s.name,
                *(
                    sum(getattr(o, f) for o in runs)
                    for f in ("items", "valid", "judgements", "validated", "validated_correct", "correct")
                ),
            )
        )
    return pooled


def labour_table(outcomes: Sequence[Outcome]) -> list[dict]:
    """Rows to print: each strategy's figures and its judgements as a share of the first's."""
    base = outcomes[0].judgements if outcomes else 0
    return [
        {
            **o.to_dict(),
            "judgements_share": o.judgements / base if base else None,
            "per_item": o.judgements / o.items if o.items else None,
        }
        for o in outcomes
    ]


def demo_truth_validity(truth: Mapping) -> dict[str, bool]:
    """item -> truly valid, from a demo truth file (``retrieval.demo.build_demo_world``):
    the single-turn queries; a planted defect a human should reject
    (:data:`retrieval.demo.HUMAN_EXPECTED`) makes an item invalid."""
    return {
        q: t["kind"] not in HUMAN_EXPECTED for q, t in sorted(truth["queries"].items()) if t.get("kind") != "session"
    }


def sharper(team: Sequence[Annotator], factor: float) -> tuple[Annotator, ...]:
    """The team with every annotator's error rates times ``factor`` (the spammer, at 0.5 / 0.5,
    stays a spammer): how the labour figures move with the annotators' quality."""

    def scaled(a: Annotator) -> Annotator:
        if a.sensitivity == a.specificity == 0.5:
            return a
        return Annotator(a.name, 1 - (1 - a.sensitivity) * factor, 1 - (1 - a.specificity) * factor)

    return tuple(scaled(a) for a in team)
