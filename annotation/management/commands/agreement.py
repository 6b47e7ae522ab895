"""python manage.py agreement (INPUT.jsonl | --study ID) [--level nominal|ordinal|interval|ratio]
[--weights none|linear|quadratic] [--rubric validity] [--categories A,B,...] [--bootstrap N] [--seed S]
[--format json|text]

Inter-annotator agreement of a set of judgements, as :func:`annotation.agreement.maths.agreement_report`
computes it. Each input line is one JSON object ``{"item": ..., "annotator": ..., "label": ...}``
(other keys are ignored; blank lines are skipped). Labels:

* nominal: a category string, a number, or a list of flag strings (one kind per file; a list
  is the category ``"flag1+flag2"`` with its flags sorted, ``[]`` the empty string);
* ordinal: a number, or a string when ``--categories`` declares the order;
* interval / ratio: a number (ratio: not negative);
* ``--rubric validity``: ``"VALIDATED"`` for a valid judgement, a list of flag names
  (``INVALID_TEXT_QUERY``, ``INVALID_IMAGE_QUERY``, ``INVALID_TARGET_IMAGE``,
  ``QUERY_TOO_BROAD``) for an invalid one, ``[]`` for invalid with no flag.

Malformed input stops the command with an error naming the file, the line and the field (each
line is read through :class:`retrieval.validation.Record`; a :class:`retrieval.records.ParseError`).

A file goes through the study path, :func:`annotation.agreement.reports.compute_agreement`
with an :class:`~annotation.agreement.reports.AgreementSpec` (level, categories, weights), so a
file and a study with the same triples give the same numbers. ``--weights``: Cohen's kappa
weights; the default is :func:`annotation.agreement.maths.default_kappa_weights` (none at the
nominal level, quadratic at the others: the rubric scales' weights). The output states the
weights used (``spec.statement``).

``--bootstrap`` (default 1000 replicates, ``--seed`` 0) adds 95% percentile intervals over
items; a large input gets a note on stderr, ``--bootstrap 0`` skips them. ``--study ID``
reports on a study instead of a file, through
:func:`annotation.agreement.reports.study_agreement`, the function behind the report page,
report.json and report.csv: the same numbers, with the rubric's categories (every scale
value) and weights (scales: ordinal, quadratic). ``--dimension`` picks a session scale.

``--constant-pairs undefined`` (default): two raters who both give one and the same label on
every shared item have an undefined Cohen's kappa (p_e = 1), left out of the pairwise mean,
which says how many pairs it covers. ``--constant-pairs one`` counts such pairs as 1.0, the
convention of the CIRCUS release (its published figures are reproduced with it).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from annotation.agreement.maths import CONSTANT_PAIRS, FLAGS, LEVELS, VALIDATED, default_kappa_weights
from config.figures import fixed
from retrieval.records import ParseError
from retrieval.validation import Record, is_number, json_type

_WEIGHTS = {"none": None, "linear": "linear", "quadratic": "quadratic"}
WEIGHTS = tuple(_WEIGHTS)
# Above this many judgement-replicates the bootstrap gets a "this may take a while" note.
_SLOW_BOOTSTRAP = 10_000_000
_FLAG_SET = frozenset(FLAGS)


_WITH_ARTICLE = {
    "boolean": "a boolean",
    "string": "a string",
    "number": "a number",
    "list": "a list",
    "object": "an object",
}


def _kind(value: Any) -> str:
    """Short JSON type name for messages (:func:`retrieval.validation.json_type` with an article)."""
    name = json_type(value)
    return _WITH_ARTICLE.get(name, name)


class JudgementChecker:
    """Validates ``(item, annotator, label)`` records one at a time and returns library triples.

    Each judgement is read through a :class:`retrieval.validation.Record` (:meth:`record`), so
    every error is a :class:`retrieval.records.ParseError` naming the source, the line
    (``line N``, 1-based) and the field. Rules: ``item`` is a non-empty string or an integer;
    ``annotator`` likewise, with one type for the whole input; the label fits the level /
    rubric (module docstring), with one kind of label for the whole input; numbers are finite;
    an (item, annotator) pair appears once; with ``categories`` every label is one of them.
    """

    def __init__(
        self,
        level: str,
        rubric: str | None,
        categories: tuple[str, ...] | None = None,
        *,
        source: str = "<input>",
        unit: str = "line",
    ):
        self.level = level
        self.rubric = rubric
        self.source = source
        self.unit = unit
        self._category_tokens = categories
        # The declared scale, typed like the labels: resolved at the first label.
        self.categories: tuple[Any, ...] | None = None
        self._category_set: frozenset[Any] | None = None
        self._label_kind: tuple[str, int] | None = None  # (kind, position first seen)
        self._annotator_kind: tuple[str, int] | None = None
        self._seen: dict[tuple[Any, Any], int] = {}  # (item, annotator) -> position

    def record(self, where: int, data: Any) -> Record:
        """The judgement at position ``where`` (1-based) as a Record named ``"<unit> <where>"``."""
        return Record(self.source, where - 1, data, "judgement", label=f"{self.unit} {where}")

    def fail(self, where: int, message: str) -> ParseError:
        """An error about the record at ``where`` as a whole (no field)."""
        return ParseError(self.source, where - 1, None, message, record_label=f"{self.unit} {where}")

    @staticmethod
    def _where(rec: Record) -> int:
        return (rec.index or 0) + 1

    def _number(self, rec: Record, value: float) -> float:
        if not math.isfinite(value):
            rec.fail("label", f"{value!r} is not a finite number")
        if self.level == "ratio" and value < 0:
            rec.fail("label", f"the ratio level needs non-negative numbers, got {value!r}")
        return value

    def _flags(self, rec: Record, flags: list[Any]) -> list[str]:
        for flag in flags:
            if not isinstance(flag, str) or not flag:
                rec.fail("label", f"a flag must be a non-empty string, got {flag!r}")
        return flags

    def _generic_label(self, rec: Record, label: Any) -> Any:
        got = f"got {_kind(label)} ({label!r})"
        if label is None:
            rec.fail("label", "null is not a label (leave a missing judgement out)")
        if is_number(label):
            return self._number(rec, label)
        if self.level in ("interval", "ratio"):
            rec.fail("label", f"the {self.level} level needs a number, {got}")
        if self.level == "ordinal":
            if isinstance(label, str) and self._category_tokens is not None:
                return label
            hint = " (or a string, when --categories declares the order)" if isinstance(label, str) else ""
            rec.fail("label", f"the ordinal level needs a number{hint}, {got}")
        if isinstance(label, str):
            if not label:
                rec.fail("label", "empty string")
            return label
        if isinstance(label, list):
            flags = self._flags(rec, label)
            bad = [f for f in flags if "+" in f]
            if bad:
                rec.fail("label", f"flag {bad[0]!r} contains '+', the flag separator")
            return "+".join(sorted(set(flags)))
        rec.fail("label", f"expected a category string, a number or a list of flags, {got}")

    def _validity_label(self, rec: Record, label: Any) -> Any:
        if label == VALIDATED and isinstance(label, str):
            return label
        if isinstance(label, list):
            unknown = [f for f in self._flags(rec, label) if f not in _FLAG_SET]
            if unknown:
                rec.fail("label", f"unknown flag {unknown[0]!r} (expected one of {', '.join(FLAGS)})")
            return label
        what = f"the string {label!r}" if isinstance(label, str) else f"{_kind(label)} ({label!r})"
        rec.fail("label", f"expected {VALIDATED!r} or a list of flags, got {what}")

    def _resolve_categories(self, rec: Record, value: Any) -> None:
        """Type the ``--categories`` tokens like the first label: numbers (sorted, except at the
        nominal level) for a number, else the strings as given."""
        tokens = self._category_tokens or ()
        if is_number(value):
            numbers = _numbers(tokens)
            if numbers is None:
                rec.fail("label", f"a number, but --categories are not all numbers ({','.join(tokens)})")
            if len(set(numbers)) != len(numbers):
                rec.fail("label", f"--categories has the same number twice ({','.join(tokens)})")
            if self.level == "ratio" and min(numbers) < 0:
                rec.fail("label", "--categories: the ratio level needs non-negative numbers")
            self.categories = tuple(numbers if self.level == "nominal" else sorted(numbers))
        else:
            self.categories = tuple(tokens)
        self._category_set = frozenset(self.categories)

    def _same_kind(self, rec: Record, field: str, kind: str, first: tuple[str, int] | None) -> tuple[str, int]:
        if first is None:
            return (kind, self._where(rec))
        if kind != first[0]:
            rec.fail(
                field,
                f"{kind}, but the {field} at {self.unit} {first[1]} is {first[0]}; "
                f"use one kind of {field} for the whole input",
            )
        return first

    def _label(self, rec: Record) -> Any:
        label = rec.req("label")
        if self.rubric == "validity":
            return self._validity_label(rec, label)
        value = self._generic_label(rec, label)
        family = "a number" if is_number(label) else _kind(label)
        self._label_kind = self._same_kind(rec, "label", family, self._label_kind)
        if self._category_tokens is not None:
            if self._category_set is None:
                self._resolve_categories(rec, value)
            if value not in self._category_set:  # type: ignore[operator]
                rec.fail("label", f"{label!r} is not one of --categories")
        return value

    def check(self, rec: Record) -> tuple[Any, Any, Any]:
        """One validated triple from a judgement record (see :meth:`record`).

        Raises :class:`retrieval.records.ParseError` naming the source, the line and the field.
        """
        item = rec.req_id("item")
        annotator = rec.req_id("annotator")
        self._annotator_kind = self._same_kind(rec, "annotator", _kind(annotator), self._annotator_kind)
        value = self._label(rec)
        where = self._where(rec)
        first = self._seen.setdefault((item, annotator), where)
        if first != where:
            rec.fail("annotator", f"annotator {annotator!r} already judged item {item!r} at {self.unit} {first}")
        return item, annotator, value


def read_jsonl(lines: Iterable[str], checker: JudgementChecker) -> list[tuple[Any, Any, Any]]:
    """Parse JSON lines into checked triples; a ParseError names the source, the line and the field."""
    triples: list[tuple[Any, Any, Any]] = []
    append, check, loads = triples.append, checker.check, json.loads
    for number, line in enumerate(lines, start=1):
        if not line or line.isspace():
            continue
        try:
            data = loads(line)
        except json.JSONDecodeError as exc:
            raise checker.fail(number, f"invalid JSON: {exc}") from None
        append(check(checker.record(number, data)))
    if not triples:
        raise ParseError(checker.source, None, None, "no judgements (the input is empty)")
    return triples


def _numbers(tokens: tuple[str, ...]) -> list[int | float] | None:
    """The tokens as numbers, or None when one is not a finite number."""
    try:
        return [_parse_number(t) for t in tokens]
    except ValueError:
        return None


def _parse_number(token: str) -> int | float:
    try:
        return int(token)
    except ValueError:
        value = float(token)
    if not math.isfinite(value):
        raise ValueError(token)
    return value


def parse_categories(text: str | None, level: str, rubric: str | None) -> tuple[str, ...] | None:
    """The ``--categories`` tokens. They are typed like the labels later (numbers for number
    labels, sorted except at the nominal level; strings otherwise, in the order given)."""
    if text is None:
        return None
    if rubric == "validity":
        raise CommandError("--categories does not apply to the validity rubric (its categories are fixed)")
    tokens = tuple(t.strip() for t in text.split(","))
    if any(not t for t in tokens):
        raise CommandError(f"--categories: empty category in {text!r}")
    if len(set(tokens)) != len(tokens):
        raise CommandError(f"--categories: duplicate category in {text!r}")
    if level in ("interval", "ratio"):
        try:
            numbers = [_parse_number(t) for t in tokens]
        except ValueError:
            raise CommandError(f"--categories: the {level} level needs numbers, got {text!r}") from None
        if level == "ratio" and min(numbers) < 0:
            raise CommandError("--categories: the ratio level needs non-negative numbers")
    return tokens


def _iter_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        yield from handle


def _fmt(value: Any) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, float):
        return fixed(value, 4)
    return str(value)


class Command(BaseCommand):
    help = (
        "Inter-annotator agreement (percent agreement, Krippendorff's alpha, Fleiss' kappa, Gwet's AC1, "
        "pairwise Cohen's kappa, bootstrap intervals) of a JSONL file of "
        '{"item", "annotator", "label"} judgements, or of a study (--study).'
    )

    def add_arguments(self, parser):
        parser.add_argument("input", nargs="?", help="JSONL file, one judgement per line.")
        parser.add_argument("--study", default=None, help="Report on a study's judgements instead of a file.")
        parser.add_argument(
            "--dimension",
            default=None,
            help="--study with a session rubric: the scale to report on (default overall); with a "
            "turn verdict also 'verdict' (the derived session verdict) or turn:N (turn N).",
        )
        parser.add_argument(
            "--turns",
            action="store_true",
            help="--study with a turn-verdict session rubric: agreement on the session verdict and "
            "on every turn position (turn 1, turn 2, ...).",
        )
        parser.add_argument(
            "--level",
            choices=LEVELS,
            default=None,
            help="Level of measurement (default nominal; a study's rubric sets its own).",
        )
        parser.add_argument(
            "--weights",
            choices=WEIGHTS,
            default=None,
            help="Cohen's kappa weights for a file (default: none at the nominal level, quadratic "
            "at the others, as for a study's rubric scales).",
        )
        parser.add_argument(
            "--rubric",
            choices=["validity"],
            default=None,
            help="validity: labels are VALIDATED or a list of flags; adds the flag blocks.",
        )
        parser.add_argument(
            "--categories",
            default=None,
            help="Comma-separated scale in its order (e.g. 1,2,3,4,5); labels must be among them.",
        )
        parser.add_argument(
            "--constant-pairs",
            choices=CONSTANT_PAIRS,
            default="undefined",
            help="Cohen's kappa of two raters constant on one label: undefined (default, left out "
            "of means) or one (the CIRCUS release's convention).",
        )
        parser.add_argument(
            "--bootstrap",
            type=int,
            default=None,
            metavar="N",
            help="Bootstrap replicates over items for the 95%% intervals (default 1000, for --study "
            "the report page's default; 0 skips).",
        )
        parser.add_argument("--seed", type=int, default=0, help="Seed of the bootstrap (default 0).")
        parser.add_argument("--format", choices=["json", "text"], default="text")

    def handle(self, *args, **opts):
        if (opts["input"] is None) == (opts["study"] is None):
            raise CommandError("give either an INPUT file or --study ID (exactly one)")
        if opts["bootstrap"] is not None and opts["bootstrap"] < 0:
            raise CommandError("--bootstrap must be 0 or more")
        started = time.perf_counter()
        if opts["turns"]:
            self._turns(opts, started)
            return
        report = self._from_study(opts) if opts["study"] is not None else self._from_file(opts)
        elapsed = time.perf_counter() - started
        if opts["format"] == "json":
            self.stdout.write(json.dumps(report, indent=2, allow_nan=False))
        else:
            self._write_text(report, elapsed)

    def _from_study(self, opts: dict[str, Any]) -> dict[str, Any]:
        """The study's agreement exactly as its report page computes it
        (:func:`annotation.agreement.reports.study_agreement`): the rubric sets the level,
        the categories (every scale value) and the weights."""
        from annotation.agreement.reports import (  # noqa: PLC0415
            default_bootstrap,
            get_study,
            label_kind,
            study_agreement,
        )

        if opts["level"] is not None or opts["categories"] is not None or opts["weights"] is not None:
            raise CommandError(
                "--level, --categories and --weights do not apply to --study: the study's rubric sets them"
            )
        study = get_study(opts["study"])
        kind = label_kind(study.rubric.rubric)
        if opts["rubric"] == "validity" and kind != "validity":
            raise CommandError(f"study {study.pk} does not use the validity rubric (its labels are {kind})")
        try:
            n_boot = default_bootstrap(study) if opts["bootstrap"] is None else opts["bootstrap"]
            return study_agreement(
                study,
                dimension=opts["dimension"],
                n_boot=n_boot,
                seed=opts["seed"],
                constant_pairs=opts["constant_pairs"],
            )
        except ValueError as exc:
            raise CommandError(f"cannot compute the report: {exc}") from None

    def _turns(self, opts: dict[str, Any], started: float) -> None:
        """``--turns``: the session verdict and every turn position, one line each (or JSON)."""
        from annotation.agreement.reports import default_bootstrap, get_study, study_turn_agreement  # noqa: PLC0415

        if opts["study"] is None or opts["dimension"] is not None:
            raise CommandError("--turns needs --study ID and no --dimension")
        study = get_study(opts["study"])
        n_boot = default_bootstrap(study) if opts["bootstrap"] is None else opts["bootstrap"]
        report = study_turn_agreement(study, n_boot=n_boot, seed=opts["seed"], constant_pairs=opts["constant_pairs"])
        if opts["format"] == "json":
            self.stdout.write(json.dumps(report, indent=2, allow_nan=False))
            return
        w = self.stdout.write
        w(
            f"Turn-by-turn agreement of study {study.pk} in {time.perf_counter() - started:.2f} s "
            f"({report['spec']['statement']}; 1 valid / 0 invalid)"
        )
        w(
            f"  {'position':<10}{'items':>7}{'judged':>8}{'valid':>8}{'agree':>8}{'alpha':>9}{'fleiss':>9}"
            f"{'AC1':>9}{'cohen':>9}"
        )
        for name, r in [("session", report["session"]), *((f"turn {p['turn']}", p) for p in report["positions"])]:
            valid = r["label_prevalence"].get(1, r["label_prevalence"].get("1"))
            w(
                f"  {name:<10}{r['n_items']:>7}{r['n_judgements']:>8}{_fmt(valid):>8}{_fmt(r['percent_agreement']):>8}"
                f"{_fmt(r['krippendorff_alpha']):>9}{_fmt(r['fleiss_kappa']):>9}{_fmt(r['gwet_ac1']):>9}"
                f"{_fmt(r['pairwise_cohen']['mean']):>9}"
            )

    def _from_file(self, opts: dict[str, Any]) -> dict[str, Any]:
        level, rubric = opts["level"] or "nominal", opts["rubric"]
        if rubric == "validity" and level != "nominal":
            raise CommandError("the validity rubric is nominal; drop --level or use --level nominal")
        if rubric == "validity" and opts["weights"] not in (None, "none"):
            raise CommandError("the validity rubric's labels are nominal: Cohen's kappa takes no weights")
        if opts["dimension"] is not None:
            raise CommandError("--dimension needs --study")
        categories = parse_categories(opts["categories"], level, rubric)
        path = Path(opts["input"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        checker = JudgementChecker(level, rubric, categories, source=str(path))
        try:
            triples = read_jsonl(_iter_lines(path), checker)
        except UnicodeDecodeError as exc:
            raise CommandError(f"{path}: not UTF-8 text ({exc})") from None
        except ParseError as exc:
            raise CommandError(str(exc)) from None
        n_boot = 1000 if opts["bootstrap"] is None else opts["bootstrap"]
        if n_boot * len(triples) > _SLOW_BOOTSTRAP:
            self.stderr.write(
                f"note: {n_boot} bootstrap replicates over {len(triples)} judgements may take a "
                "while; --bootstrap 0 skips the intervals."
            )
        from annotation.agreement.reports import AgreementSpec, compute_agreement  # noqa: PLC0415

        weights = default_kappa_weights(level) if opts["weights"] is None else _WEIGHTS[opts["weights"]]
        spec = AgreementSpec(rubric, level, checker.categories, weights)
        try:
            return compute_agreement(
                triples, spec, n_boot=n_boot, seed=opts["seed"], constant_pairs=opts["constant_pairs"]
            )
        except ValueError as exc:
            raise CommandError(f"cannot compute the report: {exc}") from None

    # ------------------------------------------------------------------ text output

    def _write_text(self, report: dict[str, Any], elapsed: float) -> None:
        w = self.stdout.write
        intervals = report["confidence_intervals"]["intervals"]

        def line(label: str, key: str, value: Any) -> None:
            iv = intervals.get(key)
            ci = f"   [{fixed(iv['low'], 4)}, {fixed(iv['high'], 4)}]" if iv else ""
            w(f"  {label:<36}{_fmt(value):>10}{ci}")

        w(f"Agreement report ({report['rubric']}, {report['level']}) in {elapsed:.2f} s")
        if "spec" in report:
            w(f"  {report['spec']['statement']}")
        w(
            f"  {report['n_items']} items ({report['n_items_excluded']} excluded: fewer than 2 ratings), "
            f"{report['n_annotators']} annotators, {report['n_judgements']} judgements"
        )
        ci = report["confidence_intervals"]
        if ci["n_boot"]:
            w(
                f"  intervals: {ci['confidence']:.0%} percentile bootstrap over items, "
                f"{ci['n_boot']} replicates, seed {ci['seed']}"
            )
        w("")
        pc = report["pairwise_cohen"]
        line("percent agreement", "percent_agreement", report["percent_agreement"])
        line("all ratings identical", "", report["all_ratings_identical_rate"])
        line(f"Krippendorff's alpha ({report['level']})", "krippendorff_alpha", report["krippendorff_alpha"])
        line("Fleiss' kappa", "fleiss_kappa", report["fleiss_kappa"])
        line("Gwet's AC1", "gwet_ac1", report["gwet_ac1"])
        line(f"Cohen's kappa, mean of {pc['count']} of {pc['n_pairs']} pairs", "pairwise_cohen_mean", pc["mean"])
        w(
            f"  {'  median / min / max':<36}{_fmt(pc['median']):>10} / {_fmt(pc['min'])} / {_fmt(pc['max'])}"
            f"   (weights: {pc['weights']}; constant pairs: {pc['constant_pairs']}, {pc['n_undefined']} undefined)"
        )
        w("")
        w("Label prevalence:")
        prevalence = {label or "(empty)": share for label, share in report["label_prevalence"].items()}
        width = max([40, *(len(label) + 2 for label in prevalence)])
        for label, share in prevalence.items():
            w(f"  {label:<{width}}{share:>8.4f}")
        if pc["by_pair"]:
            w("")
            w("Cohen's kappa by pair (shared items):")
            for key, value in pc["by_pair"].items():
                w(f"  {key:<40}{_fmt(value):>10}  ({pc['shared_items_by_pair'][key]})")
        if report["rubric"] == "validity":
            b = report["binary_valid_invalid"]
            w("")
            w("Binary valid / invalid:")
            for name in (
                "valid_rate",
                "exact_agreement_rate",
                "unanimous_valid_invalid_rate",
                "exact_invalid_signature_rate",
                "percent_agreement",
            ):
                line(name.replace("_", " "), "", b[name])
            line(
                "Krippendorff's alpha",
                "binary_valid_invalid.krippendorff_alpha_nominal",
                b["krippendorff_alpha_nominal"],
            )
            line("Fleiss' kappa", "binary_valid_invalid.fleiss_kappa", b["fleiss_kappa"])
            line("Gwet's AC1", "binary_valid_invalid.gwet_ac1", b["gwet_ac1"])
            line("Cohen's kappa, pair mean", "binary_valid_invalid.pairwise_cohen_mean", b["pairwise_cohen"]["mean"])
            w("")
            w(f"  {'flag':<24}{'positive':>10}{'alpha':>10}{'Fleiss':>10}{'AC1':>10}{'Cohen mean':>12}")
            for flag, f in report["per_flag_agreement"].items():
                w(
                    f"  {flag:<24}{_fmt(f['positive_rate']):>10}{_fmt(f['krippendorff_alpha_nominal']):>10}"
                    f"{_fmt(f['fleiss_kappa']):>10}{_fmt(f['gwet_ac1']):>10}{_fmt(f['pairwise_cohen']['mean']):>12}"
                )
            line("signature alpha (nominal)", "", report["signature_alpha_nominal"])
        if report["undefined"]:
            w("")
            w("Undefined:")
            for key, reason in report["undefined"].items():
                w(f"  {key}: {reason}")
