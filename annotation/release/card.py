"""README.md of a release: a dataset card with the sections of the Hugging Face template,
its numbers taken from :func:`annotation.release.facts.study_facts` (the report services'
own dicts) and the placeholders of :mod:`annotation.release.croissant` for what CIRVal cannot know."""

from __future__ import annotations

from typing import Any

from annotation.release.croissant import PLACEHOLDER, UNKNOWN_FIELDS, agreement_text, protocol_text
from annotation.release.facts import source_lines, study_facts
from annotation.release.leaderboards import leaderboard_lines
from annotation.studies.estimating import card_lines
from config.figures import percent


def _pct(share: float | None) -> str:
    return "n/a" if share is None else percent(share)


def _study_numbers(f: dict[str, Any]) -> list[str]:
    out = [
        f"### Study `{f['name']}` (folder `{f['folder']}/`)",
        "",
        f"* Items in the study: {f['items']} ({f['judgements']} judgements by {f['annotators']} annotators)",
        f"* Validated: {f['validated']} (rejected {f['rejected']}, decided by an adjudicator {f['adjudicated']}, "
        f"below the quorum {f['pending']}, unjudged {f['unjudged']}, waiting for adjudication "
        f"{f['awaiting_adjudication']}; only validated items are released)",
        f"* Agreement: {agreement_text(f['agreement'])}",
    ]
    alt = f["alternatives_per_query"]
    if alt is not None:
        out.append(
            f"* Alternatives added per query: mean {alt['mean'] if alt['mean'] is None else round(alt['mean'], 3)} "
            f"over {alt['items']} judged queries ({alt['with_alternatives']} with at least one; rule {alt['rule']})"
        )
    for name, a in f["audits"].items():
        out.append(
            f"* Audit of `{name}`: {a['queries']} queries audited at K={a['k']} with "
            f"{', '.join(f'`{r}`' for r in a['retrievers'])}"
        )
        out.extend(f"  * {label}: {a['counts'][label]} ({_pct(a['shares'][label])})" for label in a["counts"])
    return out + [""]


def dataset_card(parts: list, release: dict[str, Any]) -> str:
    """The dataset card (Markdown) of a release."""
    facts = [study_facts(p) for p in parts]
    names = ", ".join(f"`{f['name']}`" for f in facts)
    lines = [
        "# Dataset card: " + ", ".join(f["name"] for f in facts),
        "",
        "## Dataset summary",
        "",
        f"Validated composed image retrieval (CIR) queries from the CIRVal studies {names}: each query was "
        "audited for shortcuts by a pool of retrievers, then judged by human annotators; only the queries the "
        "consensus validated are released.",
        "",
        "## Dataset structure",
        "",
        "* `croissant.json`: Croissant 1.1 metadata with the Responsible-AI fields (validate it with mlcroissant).",
        "* `SHA256SUMS`: checksums of every file (`sha256sum -c SHA256SUMS`).",
        "* `release.json`: the CIRVal commit, studies, rubric versions, retrievers (spec, checkpoint file "
        "name and sha256); `released_at` is the only field that changes when the release is made again.",
        "* `study-<id>/<layout>/`: the validated queries (M-BEIR JSONL, CIRCO or CIRCLED layout), a trace "
        "file beside each (consensus, votes, adjudication) and `manifest.json` (counts, sha256).",
        "* `study-<id>/agreement.json|csv`, `alternatives.json`, `audit/<dataset>.json`: the study's reports.",
        "* `study-<id>/rubric.json`, `guidelines.md`: what annotators were asked.",
        "",
        "## Dataset creation",
        "",
        "Queries were drawn from the source datasets by a seeded sampler, audited with the retriever pools "
        "named below (each query labelled by which modality could retrieve its target within K), then judged.",
        "",
    ]
    for r in release["retrievers"]:
        lines.append(f"* retriever `{r['spec']}`: checkpoint sha256 {r['checkpoint_sha256'] or 'n/a'}")
    lines += ["", "## Annotation process", ""]
    for f in facts:
        lines.append(
            f"* {protocol_text(f)} {f['overlap']} annotators per item (fixed overlap), decided at a quorum "
            f"of {f['quorum']}; gold rate {f['gold_rate']:g}; {f['training_items']} training items."
        )
    lines += ["", "## Numbers", ""]
    for part, f in zip(parts, facts):
        lines += _study_numbers(f) + card_lines(part.study)
    lines += leaderboard_lines(parts)
    lines += [
        "## Who are the annotators",
        "",
        "Annotators (named `annotator_NN`), adjudicators (`adjudicator_NN`) who decide flagged and tied "
        "items, and staff who ran the studies. No names are released.",
        "",
        f"* {PLACEHOLDER} {UNKNOWN_FIELDS['rai:annotatorDemographics']}.",
        "",
        "## Personal and sensitive information",
        "",
        f"{PLACEHOLDER} {UNKNOWN_FIELDS['rai:personalSensitiveInformation']}.",
        "",
        "## Bias, risks and limitations",
        "",
    ]
    for f in facts:
        for name, a in f["audits"].items():
            lines.extend(f"* `{name}`: {w}" for w in a["warnings"])
    lines += [
        "* Only validated items are released; a rejected query is absent, not corrected.",
        "* The pool keeps the queries the audit could not rule out, so it leans towards what the "
        "retriever pool finds hard.",
        "",
        "## Maintenance",
        "",
        f"{PLACEHOLDER} {UNKNOWN_FIELDS['rai:dataReleaseMaintenancePlan']}.",
        "",
        "## Licence and citation",
        "",
    ]
    lines += [
        f"* `{name}` ({fmt}): licence {lic}; cite {cite}" for name, fmt, lic, cite in source_lines(facts, PLACEHOLDER)
    ]
    lines += ["", f"Made with CIRVal commit `{release['cirval_commit']}`.", ""]
    return "\n".join(lines)
