"""croissant.json of a release: Croissant 1.1 metadata with the Responsible-AI (RAI 1.0) fields,
built with mlcroissant's own classes (``mlc.Metadata``, ``FileObject``, ``FileSet``,
``RecordSet``, ``Field``) and written by its ``to_json``: the JSON-LD context, the terms and
their order are mlcroissant's, and the document is checked by mlcroissant as it is built.

* ``distribution``: one ``cr:FileObject`` per file of the release (``contentUrl`` relative to
  croissant.json, ``sha256``; all but release.json, whose ``released_at`` changes each time), and
  one ``cr:FileSet`` per kind of file (query files, trace files, CIRCO files, CIRCLED files)
  whose ``includes`` are the exact paths of those files.
* ``recordSet``: per study, ``queries``, ``targets``, ``verdicts`` and ``alternatives`` (M-BEIR
  layout, category rubrics), ``circo_queries`` (CIRCO layout), ``sessions``, ``turns`` and
  ``verdicts`` (CIRCLED layout, session rubrics). Their fields are the export's own
  (:mod:`annotation.core.export_fields`: names, types, nesting), read from a JSONL column (with
  a ``jsonPath`` transform into nested values) or a ``jsonPath`` of a JSON file, so
  ``mlcroissant`` reads back every line of the files.
* RAI fields are filled from what CIRVal knows (facts of :mod:`annotation.release.facts`); the
  ones it cannot know carry :data:`PLACEHOLDER` and are listed by :func:`placeholders`.

mlcroissant (and pandas, rdflib under it) is imported when a release is written, never by a
web request: the release runs on a worker or from ``manage.py release``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.utils.text import slugify

from annotation.core.export_fields import (
    CIRCLED_SESSION,
    CIRCLED_TURN,
    CIRCO_QUERY,
    INTEGER,
    MBEIR_QUERY,
    SESSION_TRACE,
    TRACE,
    TRACE_POSITIVES,
    Column,
)
from annotation.release.facts import source_lines, study_facts
from annotation.release.files import RELEASE_JSON, file_sums

CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
RAI_CONFORMS_TO = "http://mlcommons.org/croissant/RAI/1.0"
PLACEHOLDER = "TO BE FILLED IN BY THE PUBLISHER:"
#: RAI (and dataset) fields CIRVal cannot know: the user fills them in (the command lists them).
UNKNOWN_FIELDS: dict[str, str] = {
    "rai:personalSensitiveInformation": "whether the images or texts show people or hold personal or sensitive "
    "information, and how it was handled",
    "rai:dataReleaseMaintenancePlan": "who maintains the release, where errors are reported, how versions are kept",
    "rai:annotatorDemographics": "who the annotators are (recruitment, pay, expertise), if you may say so",
    "rai:dataSocialImpact": "the possible social impact of the data",
    "url": "where the release is published",
    "creator": "the people or group publishing the release",
}
ENCODING = {".jsonl": "application/jsonlines", ".json": "application/json", ".csv": "text/csv", ".md": "text/markdown"}
JSONL, JSON = "application/jsonlines", "application/json"


def placeholders(parts: list | None = None) -> list[str]:
    """The fields a publisher must fill in, with what each asks for: :data:`UNKNOWN_FIELDS`,
    then ``license`` / ``citeAs`` for each source dataset CIRVal has no record of."""
    out = [f"{key}: {what}" for key, what in UNKNOWN_FIELDS.items()]
    rows = source_lines([study_facts(p) for p in parts or []], PLACEHOLDER)
    out += [
        f"{key}: {value[len(PLACEHOLDER) :].strip()} of {name}"
        for name, _, lic, cite in rows
        for key, value in (("license", lic), ("citeAs", cite))
        if value.startswith(PLACEHOLDER)
    ]
    return list(dict.fromkeys(out))


def _placeholder(key: str) -> str:
    return f"{PLACEHOLDER} {UNKNOWN_FIELDS[key]}."


class _Builder:
    """Makes the nodes of one croissant.json: every node shares one mlcroissant ``Context``,
    and every ``@id`` is named here (mlcroissant would draw a random one)."""

    def __init__(self):
        import mlcroissant as mlc

        self.mlc = mlc
        self.ctx = mlc.Context(conforms_to=CONFORMS_TO)
        self.types = {INTEGER: mlc.DataType.INTEGER}

    def file_objects(self, root: Path, sums: dict[str, str]) -> list:
        return [
            self.mlc.FileObject(
                ctx=self.ctx,
                id="file/" + name,
                name=name,
                content_url=name,
                encoding_formats=[ENCODING.get(Path(name).suffix, "text/plain")],
                sha256=sums[name],
                content_size=f"{(root / name).stat().st_size} B",
            )
            for name in sorted(sums)
        ]

    def file_set(self, fid: str, paths: list[str], fmt: str, description: str):
        return self.mlc.FileSet(
            ctx=self.ctx, id=fid, name=fid, description=description, encoding_formats=[fmt], includes=sorted(paths)
        )

    def field(self, rs: str, fileset: str, col: Column, json_file: bool = False):
        """A field of the record set ``rs``: a JSONL line's column (a nested value through a
        ``jsonPath`` transform), or a ``jsonPath`` from the root of a JSON file."""
        mlc = self.mlc
        if json_file:
            source = mlc.Source(ctx=self.ctx, file_set=fileset, extract=mlc.Extract(ctx=self.ctx, json_path=col.path))
        else:
            transforms = [mlc.Transform(ctx=self.ctx, json_path=col.path)] if col.path else []
            source = mlc.Source(
                ctx=self.ctx, file_set=fileset, extract=mlc.Extract(ctx=self.ctx, column=col.key), transforms=transforms
            )
        array = {"is_array": True, "array_shape": "-1"} if col.array else {}
        return mlc.Field(
            ctx=self.ctx,
            id=f"{rs}/{col.name}",
            name=col.name,
            data_types=[self.types.get(col.type, mlc.DataType.TEXT)],
            source=source,
            **array,
        )

    def record_set(self, rs: str, description: str, fileset: str, columns, json_file: bool = False):
        return self.mlc.RecordSet(
            ctx=self.ctx,
            id=rs,
            name=rs,
            description=description,
            fields=[self.field(rs, fileset, c, json_file) for c in columns if c.published],
        )


def _export_files(part, layout: str) -> dict[str, list[str]]:
    """The export's query and trace files of one layout, relative to the release root."""
    base = f"{part.folder}/{layout}/"
    files: dict[str, list[str]] = {"queries": [], "trace": []}
    for f in part.exports[layout]["files"]:
        files[f["kind"]].append(base + f["path"])
    return files


_QID = MBEIR_QUERY[0]


def _jsonl_sets(doc: _Builder, prefix: str, files: dict[str, list[str]], session: bool) -> tuple[list, list]:
    fs_q, fs_t = f"{prefix}/query-files", f"{prefix}/trace-files"
    sets = [
        doc.file_set(
            fs_t,
            files["trace"],
            JSONL,
            "Trace lines: the consensus, every vote and the adjudication behind each exported line.",
        )
    ]
    records = [
        doc.record_set(
            f"{prefix}/verdicts",
            "One verdict per exported query: the consensus status, its policy and the votes.",
            fs_t,
            SESSION_TRACE if session else TRACE,
        )
    ]
    if session:
        return sets, records
    sets.append(doc.file_set(fs_q, files["queries"], JSONL, "Validated queries, M-BEIR layout."))
    lists = tuple(c for c in MBEIR_QUERY if c.array)
    for name, columns, fs, what in (
        ("queries", tuple(c for c in MBEIR_QUERY if not c.array), fs_q, "Validated queries (M-BEIR query layout)."),
        ("targets", (_QID, *lists), fs_q, "Positive and negative candidates of each validated query."),
        (
            "alternatives",
            (_QID, *TRACE_POSITIVES),
            fs_t,
            "Every positive of each query and where it comes from: labelled, or an alternative accepted by "
            "the annotators.",
        ),
    ):
        records.append(doc.record_set(f"{prefix}/{name}", what, fs, columns))
    return sets, records


def _at(columns, root: str) -> tuple[Column, ...]:
    """``columns`` read from a JSON array file: each value at ``root`` + its name."""
    return tuple(Column(c.name, c.type, c.array, path=f"{root}.{c.name}", published=c.published) for c in columns)


def _json_sets(doc: _Builder, prefix: str, files: list[str], layout: str) -> tuple[list, list]:
    fs = f"{prefix}/{layout}-files"
    if layout == "circo":
        sets = [doc.file_set(fs, files, JSON, "Validated queries in CIRCO's annotation layout.")]
        return sets, [
            doc.record_set(
                f"{prefix}/circo_queries",
                "Validated queries (CIRCO layout; id = position in the file).",
                fs,
                _at(CIRCO_QUERY, "$[*]"),
                json_file=True,
            )
        ]
    # one FileSet per RecordSet: mlcroissant reads every field of a JSON FileSet into one table,
    # so sessions and their turns (two lengths) read the same files through two FileSets
    fs_t = f"{prefix}/{layout}-turn-files"
    sets = [
        doc.file_set(fs, files, JSON, "Validated sessions in the CIRCLED public layout."),
        doc.file_set(fs_t, files, JSON, "The same files, read turn by turn."),
    ]
    return sets, [
        doc.record_set(f"{prefix}/sessions", "Validated sessions.", fs, _at(CIRCLED_SESSION, "$[*]"), json_file=True),
        doc.record_set(
            f"{prefix}/turns",
            "Every turn of every validated session, in file order.",
            fs_t,
            _at(CIRCLED_TURN, "$[*].turns[*]"),
            json_file=True,
        ),
    ]


def _study_sets(doc: _Builder, part) -> tuple[list, list]:
    sets: list = []
    records: list = []
    for layout in part.layouts:
        files = _export_files(part, layout)
        prefix = f"{part.folder}/{layout}"
        if layout == "mbeir":
            s, r = _jsonl_sets(doc, prefix, files, False)
        else:
            s, r = _json_sets(doc, prefix, files["queries"], layout)
            if layout == "circled":
                s2, r2 = _jsonl_sets(doc, prefix, files, True)
                s, r = s + s2, r + r2
        sets += s
        records += r
    return sets, records


def _num(value: Any, digits: int = 3) -> str:
    return "undefined" if value is None else f"{value:.{digits}f}"


def agreement_text(agreement: dict[str, Any]) -> str:
    """The agreement coefficients with their 95% bootstrap intervals, in words."""
    parts = []
    for key in ("krippendorff_alpha", "fleiss_kappa", "gwet_ac1", "percent_agreement"):
        a = agreement[key]
        iv = f" (95% CI {_num(a['low'])} to {_num(a['high'])})" if a["low"] is not None else ""
        parts.append(f"{key.replace('_', ' ')} {_num(a['value'])}{iv}")
    return "; ".join(parts) + f" ({agreement['n_boot']} bootstrap replicates over items)"


def _audit_text(name: str, a: dict[str, Any]) -> str:
    shares = ", ".join(
        f"{k} {a['counts'][k]} ({_num(a['shares'][k] * 100 if a['shares'][k] is not None else None, 1)}%)"
        for k in a["counts"]
    )
    return (
        f"{name}: {a['queries']} queries audited with the retriever pool {', '.join(a['retrievers'])} at "
        f"K={a['k']}; labels {shares}"
    )


def protocol_text(f: dict[str, Any]) -> str:
    """The annotation protocol of one study in words (rubric, guidelines, consensus)."""
    r = f["rubric"]
    return (
        f"Study {f['name']}: rubric {r['key']} version {r['version']} ({r['title']}): "
        f"{r['description']} Full rubric text in {f['folder']}/rubric.json; guidelines version "
        f"{f['guidelines_version'] or 'none saved'} in {f['folder']}/guidelines.md. Consensus: "
        f"{f['consensus_rule']}."
    )


def _rai(facts: list[dict[str, Any]], release: dict[str, Any]) -> dict[str, Any]:
    proto, analysis, per_item, uses, limits, machine, collection = [], [], [], [], [], [], []
    for f in facts:
        proto.append(protocol_text(f))
        per_item.append(
            f"{f['name']}: {f['overlap']} annotators per item (fixed overlap; decided at a quorum of "
            f"{f['quorum']}); {f['annotators']} annotators in all, named annotator_NN; gold items at "
            f"a rate of {f['gold_rate']:g}, {f['training_items']} training items before counting."
        )
        analysis.append(
            f"{f['name']}: {f['judgements']} judgements of {f['items']} items; {f['validated']} "
            f"validated, {f['rejected']} rejected, {f['adjudicated']} decided by an adjudicator, "
            f"{f['pending']} below the quorum, {f['unjudged']} unjudged. Agreement: "
            f"{agreement_text(f['agreement'])}."
        )
        for name, a in f["audits"].items():
            machine.append(_audit_text(name, a))
            limits.extend(f"{name}: {w}" for w in a["warnings"])
        if f["pending"] or f["unjudged"]:
            limits.append(
                f"{f['name']}: {f['pending'] + f['unjudged']} of {f['items']} items were not decided "
                "(below the quorum or unjudged) and are not released."
            )
        collection.append(
            f"{f['name']}: queries of {', '.join(f['datasets'])} drawn by CIRVal's seeded sampler "
            "and judged by people in CIRVal's annotation tool."
        )
    uses.append(
        "Evaluating composed image retrieval models on queries that human annotators validated and that "
        "no single-modality retriever of the audit pool could solve; studying annotation quality."
    )
    limits.append("Only validated items are released; a rejected query is absent, not corrected.")
    # mlcroissant's Metadata arguments; a one-element list is written as its one value
    return {
        "data_collection": " ".join(collection),
        "data_collection_type": ["Manual Human Curation", "Software Collection"],
        "data_annotation_protocol": [" ".join(proto)],
        "data_annotation_platform": [f"CIRVal (commit {release['cirval_commit']})"],
        "data_annotation_analysis": [" ".join(analysis)],
        "annotations_per_item": " ".join(per_item),
        "machine_annotation_tools": [" ".join(machine) or "No audit run behind these studies."],
        "data_use_cases": [" ".join(uses)],
        "data_limitations": [" ".join(limits)],
        "data_biases": [
            "The pool keeps the queries the audit could not rule out, so it leans towards what the "
            "retriever pool finds hard; see the label shares in rai:machineAnnotationTools."
        ],
        "personal_sensitive_information": [_placeholder("rai:personalSensitiveInformation")],
        "data_release_maintenance_plan": _placeholder("rai:dataReleaseMaintenancePlan"),
        "annotator_demographics": [_placeholder("rai:annotatorDemographics")],
        "data_social_impact": _placeholder("rai:dataSocialImpact"),
    }


def _licence_and_citation(facts: list[dict[str, Any]]) -> tuple[str, str]:
    rows = source_lines(facts, PLACEHOLDER)
    return (
        "; ".join(dict.fromkeys(f"{name}: {lic}" for name, _, lic, _ in rows)),
        " ".join(dict.fromkeys(f"{name}: {cite}" for name, _, _, cite in rows)),
    )


def croissant(parts: list, release: dict[str, Any], root: Path) -> dict[str, Any]:
    """The croissant.json document of a release written under ``root`` (every file but
    croissant.json and SHA256SUMS exists already), as mlcroissant writes its ``Metadata``."""
    doc = _Builder()
    facts = [study_facts(p) for p in parts]
    # release.json holds the one timestamp: left out, so that croissant.json stays byte-identical
    sums = file_sums(root, skip=(RELEASE_JSON,))
    sets: list = []
    records: list = []
    for part in parts:
        s, r = _study_sets(doc, part)
        sets += s
        records += r
    licence, citation = _licence_and_citation(facts)
    names = ", ".join(f["name"] for f in facts)
    metadata = doc.mlc.Metadata(
        ctx=doc.ctx,
        conforms_to=[CONFORMS_TO, RAI_CONFORMS_TO],
        name=slugify(f"cirval-{names}") or "cirval-release",
        description=f"The validated items of {names}: composed image retrieval queries audited for shortcuts "
        "and judged by annotators in CIRVal. "
        + " ".join(f"{f['name']}: {f['validated']} validated of {f['items']} items." for f in facts),
        license=[licence],
        cite_as=citation,
        url=_placeholder("url"),
        creators=[doc.mlc.Organization(ctx=doc.ctx, name=_placeholder("creator"))],
        date_published=max(s["data_as_of"] for s in release["studies"]),
        version="1.0.0",
        distribution=doc.file_objects(root, sums) + sets,
        record_sets=records,
        **_rai(facts, release),
    )
    return metadata.to_json()
