"""croissant.json of a release: Croissant 1.1 metadata with the Responsible-AI (RAI 1.0) fields.

* ``distribution``: one ``cr:FileObject`` per file of the release (``contentUrl`` relative to
  croissant.json, ``sha256``; all but release.json, whose ``released_at`` changes each time), and one ``cr:FileSet`` per kind of file (query files, trace
  files, CIRCO files, CIRCLED files) whose ``includes`` are the exact paths of those files.
* ``recordSet``: per study, ``queries``, ``targets``, ``verdicts`` and ``alternatives`` (M-BEIR
  layout, category rubrics), ``circo_queries`` (CIRCO layout), ``sessions``, ``turns`` and
  ``verdicts`` (CIRCLED layout, session rubrics); fields read a JSONL column (with a
  ``jsonPath`` transform into nested values) or a ``jsonPath`` of a JSON file, so
  ``mlcroissant`` reads back every line of the files.
* RAI fields are filled from what CIRVal knows (facts of :mod:`annotation.release.facts`); the
  ones it cannot know carry :data:`PLACEHOLDER` and are listed by :func:`placeholders`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.utils.text import slugify

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

#: The Croissant 1.1 JSON-LD context (the term mapping of the Croissant and RAI specifications).
CONTEXT: dict[str, Any] = {
    "@language": "en", "@vocab": "https://schema.org/", "arrayShape": "cr:arrayShape", "citeAs": "cr:citeAs",
    "column": "cr:column", "conformsTo": "dct:conformsTo", "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/", "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"}, "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/", "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"}, "extract": "cr:extract", "field": "cr:field",
    "fileProperty": "cr:fileProperty", "fileObject": "cr:fileObject", "fileSet": "cr:fileSet",
    "format": "cr:format", "includes": "cr:includes", "isArray": "cr:isArray", "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath", "key": "cr:key", "md5": "cr:md5", "parentField": "cr:parentField", "path": "cr:path",
    "recordSet": "cr:recordSet", "references": "cr:references", "regex": "cr:regex", "repeated": "cr:repeated",
    "replace": "cr:replace", "samplingRate": "cr:samplingRate", "sc": "https://schema.org/",
    "separator": "cr:separator", "source": "cr:source", "subField": "cr:subField", "transform": "cr:transform",
}

TEXT, INT, BOOL = "sc:Text", "sc:Integer", "sc:Boolean"
#: (field name, type, JSONL column, jsonPath inside the column or None, is an array)
QUERY_FIELDS = [("qid", TEXT, "qid", None, False), ("query_txt", TEXT, "query_txt", None, False),
                ("query_img_path", TEXT, "query_img_path", None, False),
                ("query_modality", TEXT, "query_modality", None, False),
                ("query_src_content", TEXT, "query_src_content", None, False), ("task_id", INT, "task_id", None, False)]
TARGET_FIELDS = [("qid", TEXT, "qid", None, False), ("pos_cand_list", TEXT, "pos_cand_list", None, True),
                 ("neg_cand_list", TEXT, "neg_cand_list", None, True)]
VERDICT_FIELDS = [("qid", TEXT, "qid", None, False), ("item", INT, "item", None, False),
                  ("dataset", TEXT, "dataset", None, False), ("subset", TEXT, "subset", None, False),
                  ("hidden_category", TEXT, "hidden_category", None, False),
                  ("status", TEXT, "consensus", "status", False), ("policy", TEXT, "consensus", "policy", False),
                  ("n_votes", INT, "consensus", "n_votes", False), ("valid_votes", INT, "consensus", "valid_votes", False)]
SESSION_VERDICT_FIELDS = [f for f in VERDICT_FIELDS if f[0] not in ("valid_votes",)]
ALTERNATIVE_FIELDS = [("qid", TEXT, "qid", None, False), ("images", TEXT, "positives", "[*].image", True),
                      ("sources", TEXT, "positives", "[*].source", True)]
#: JSON files (one array per file): (field name, type, jsonPath)
CIRCO_FIELDS = [("id", INT, "$[*].id"), ("relative_caption", TEXT, "$[*].relative_caption"),
                ("shared_concept", TEXT, "$[*].shared_concept")]
SESSION_FIELDS = [("session_id", TEXT, "$[*].session_id"), ("subset", TEXT, "$[*].subset"),
                  ("num_turns", INT, "$[*].num_turns")]
TURN_FIELDS = [("turn", INT, "$[*].turns[*].turn"), ("reference_image_id", TEXT, "$[*].turns[*].reference_image_id"),
               ("relative_caption", TEXT, "$[*].turns[*].relative_caption")]

ENCODING = {".jsonl": "application/jsonlines", ".json": "application/json", ".csv": "text/csv",
            ".md": "text/markdown"}


def placeholders(parts: list | None = None) -> list[str]:
    """The fields a publisher must fill in, with what each asks for: :data:`UNKNOWN_FIELDS`,
    then ``license`` / ``citeAs`` for each source dataset CIRVal has no record of."""
    out = [f"{key}: {what}" for key, what in UNKNOWN_FIELDS.items()]
    rows = source_lines([study_facts(p) for p in parts or []], PLACEHOLDER)
    out += [f"{key}: {value[len(PLACEHOLDER):].strip()} of {name}" for name, _, lic, cite in rows
            for key, value in (("license", lic), ("citeAs", cite)) if value.startswith(PLACEHOLDER)]
    return list(dict.fromkeys(out))


def _placeholder(key: str) -> str:
    return f"{PLACEHOLDER} {UNKNOWN_FIELDS[key]}."


def _file_id(path: str) -> str:
    return "file/" + path


def _file_objects(root: Path, sums: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for name in sorted(sums):
        suffix = Path(name).suffix
        out.append({"@type": "cr:FileObject", "@id": _file_id(name), "name": name, "contentUrl": name,
                    "encodingFormat": ENCODING.get(suffix, "text/plain"), "sha256": sums[name],
                    "contentSize": f"{(root / name).stat().st_size} B"})
    return out


def _jsonl_field(rs: str, fileset: str, spec: tuple) -> dict[str, Any]:
    name, dtype, column, path, array = spec
    source: dict[str, Any] = {"fileSet": {"@id": fileset}, "extract": {"column": column}}
    if path:
        source["transform"] = {"jsonPath": path}
    out = {"@type": "cr:Field", "@id": f"{rs}/{name}", "name": name, "dataType": dtype, "source": source}
    if array:
        out["isArray"] = True
        out["arrayShape"] = "-1"
    return out


def _json_field(rs: str, fileset: str, spec: tuple) -> dict[str, Any]:
    name, dtype, path = spec
    return {"@type": "cr:Field", "@id": f"{rs}/{name}", "name": name, "dataType": dtype,
            "source": {"fileSet": {"@id": fileset}, "extract": {"jsonPath": path}}}


def _record_set(rs: str, description: str, fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {"@type": "cr:RecordSet", "@id": rs, "name": rs, "description": description, "field": fields}


def _file_set(fid: str, paths: list[str], fmt: str, description: str) -> dict[str, Any]:
    return {"@type": "cr:FileSet", "@id": fid, "name": fid, "description": description, "encodingFormat": fmt,
            "includes": sorted(paths)}


def _export_files(part, layout: str) -> dict[str, list[str]]:
    """The export's query and trace files of one layout, relative to the release root."""
    base = f"{part.folder}/{layout}/"
    files: dict[str, list[str]] = {"queries": [], "trace": []}
    for f in part.exports[layout]["files"]:
        files[f["kind"]].append(base + f["path"])
    return files


def _jsonl_sets(prefix: str, files: dict[str, list[str]], session: bool) -> tuple[list, list]:
    fs_q, fs_t = f"{prefix}/query-files", f"{prefix}/trace-files"
    sets = [_file_set(fs_t, files["trace"], "application/jsonlines",
                      "Trace lines: the consensus, every vote and the adjudication behind each exported line.")]
    rs_v = f"{prefix}/verdicts"
    records = [_record_set(rs_v, "One verdict per exported query: the consensus status, its policy and the votes.",
                           [_jsonl_field(rs_v, fs_t, f) for f in (SESSION_VERDICT_FIELDS if session else VERDICT_FIELDS)])]
    if session:
        return sets, records
    sets.append(_file_set(fs_q, files["queries"], "application/jsonlines", "Validated queries, M-BEIR layout."))
    for name, fields, fs, what in (
            ("queries", QUERY_FIELDS, fs_q, "Validated queries (M-BEIR query layout)."),
            ("targets", TARGET_FIELDS, fs_q, "Positive and negative candidates of each validated query."),
            ("alternatives", ALTERNATIVE_FIELDS, fs_t,
             "Every positive of each query and where it comes from: labelled, or an alternative accepted by "
             "the annotators.")):
        rs = f"{prefix}/{name}"
        records.append(_record_set(rs, what, [_jsonl_field(rs, fs, f) for f in fields]))
    return sets, records


def _json_sets(prefix: str, files: list[str], layout: str) -> tuple[list, list]:
    fs = f"{prefix}/{layout}-files"
    if layout == "circo":
        sets = [_file_set(fs, files, "application/json", "Validated queries in CIRCO's annotation layout.")]
        rs = f"{prefix}/circo_queries"
        return sets, [_record_set(rs, "Validated queries (CIRCO layout; id = position in the file).",
                                  [_json_field(rs, fs, f) for f in CIRCO_FIELDS])]
    # one FileSet per RecordSet: mlcroissant reads every field of a JSON FileSet into one table,
    # so sessions and their turns (two lengths) read the same files through two FileSets
    fs_t = f"{prefix}/{layout}-turn-files"
    sets = [_file_set(fs, files, "application/json", "Validated sessions in the CIRCLED public layout."),
            _file_set(fs_t, files, "application/json", "The same files, read turn by turn.")]
    rs_s, rs_t = f"{prefix}/sessions", f"{prefix}/turns"
    return sets, [_record_set(rs_s, "Validated sessions.", [_json_field(rs_s, fs, f) for f in SESSION_FIELDS]),
                  _record_set(rs_t, "Every turn of every validated session, in file order.",
                              [_json_field(rs_t, fs_t, f) for f in TURN_FIELDS])]


def _study_sets(part) -> tuple[list, list]:
    sets: list = []
    records: list = []
    for layout in part.layouts:
        files = _export_files(part, layout)
        prefix = f"{part.folder}/{layout}"
        if layout == "mbeir":
            s, r = _jsonl_sets(prefix, files, False)
        else:
            s, r = _json_sets(prefix, files["queries"], layout)
            if layout == "circled":
                s2, r2 = _jsonl_sets(prefix, files, True)
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
    shares = ", ".join(f"{k} {a['counts'][k]} ({_num(a['shares'][k] * 100 if a['shares'][k] is not None else None, 1)}%)"
                       for k in a["counts"])
    return (f"{name}: {a['queries']} queries audited with the retriever pool {', '.join(a['retrievers'])} at "
            f"K={a['k']}; labels {shares}")


def protocol_text(f: dict[str, Any]) -> str:
    """The annotation protocol of one study in words (rubric, guidelines, consensus)."""
    r = f["rubric"]
    return (f"Study {f['name']}: rubric {r['key']} version {r['version']} ({r['title']}): "
            f"{r['description']} Full rubric text in {f['folder']}/rubric.json; guidelines version "
            f"{f['guidelines_version'] or 'none saved'} in {f['folder']}/guidelines.md. Consensus: "
            f"{f['consensus_rule']}.")


def _rai(facts: list[dict[str, Any]], release: dict[str, Any]) -> dict[str, Any]:
    proto, analysis, per_item, uses, limits, machine, collection = [], [], [], [], [], [], []
    for f in facts:
        proto.append(protocol_text(f))
        per_item.append(f"{f['name']}: {f['overlap']} annotators per item (fixed overlap; decided at a quorum of "
                        f"{f['quorum']}); {f['annotators']} annotators in all, named annotator_NN; gold items at "
                        f"a rate of {f['gold_rate']:g}, {f['training_items']} training items before counting.")
        analysis.append(f"{f['name']}: {f['judgements']} judgements of {f['items']} items; {f['validated']} "
                        f"validated, {f['rejected']} rejected, {f['adjudicated']} decided by an adjudicator, "
                        f"{f['pending']} below the quorum, {f['unjudged']} unjudged. Agreement: "
                        f"{agreement_text(f['agreement'])}.")
        for name, a in f["audits"].items():
            machine.append(_audit_text(name, a))
            limits.extend(f"{name}: {w}" for w in a["warnings"])
        if f["pending"] or f["unjudged"]:
            limits.append(f"{f['name']}: {f['pending'] + f['unjudged']} of {f['items']} items were not decided "
                          "(below the quorum or unjudged) and are not released.")
        collection.append(f"{f['name']}: queries of {', '.join(f['datasets'])} drawn by CIRVal's seeded sampler "
                          "and judged by people in CIRVal's annotation tool.")
    uses.append("Evaluating composed image retrieval models on queries that human annotators validated and that "
                "no single-modality retriever of the audit pool could solve; studying annotation quality.")
    limits.append("Only validated items are released; a rejected query is absent, not corrected.")
    return {
        "rai:dataCollection": " ".join(collection),
        "rai:dataCollectionType": ["Manual Human Curation", "Software Collection"],
        "rai:dataAnnotationProtocol": " ".join(proto),
        "rai:dataAnnotationPlatform": f"CIRVal (commit {release['cirval_commit']})",
        "rai:dataAnnotationAnalysis": " ".join(analysis),
        "rai:annotationsPerItem": " ".join(per_item),
        "rai:machineAnnotationTools": " ".join(machine) or "No audit run behind these studies.",
        "rai:dataUseCases": " ".join(uses),
        "rai:dataLimitations": " ".join(limits),
        "rai:dataBiases": "The pool keeps the queries the audit could not rule out, so it leans towards what the "
                          "retriever pool finds hard; see the label shares in rai:machineAnnotationTools.",
        **{key: _placeholder(key) for key in UNKNOWN_FIELDS if key.startswith("rai:")},
    }


def _licence_and_citation(facts: list[dict[str, Any]]) -> tuple[str, str]:
    rows = source_lines(facts, PLACEHOLDER)
    return ("; ".join(dict.fromkeys(f"{name}: {lic}" for name, _, lic, _ in rows)),
            " ".join(dict.fromkeys(f"{name}: {cite}" for name, _, _, cite in rows)))


def croissant(parts: list, release: dict[str, Any], root: Path) -> dict[str, Any]:
    """The croissant.json document of a release written under ``root`` (every file but
    croissant.json and SHA256SUMS exists already)."""
    facts = [study_facts(p) for p in parts]
    # release.json holds the one timestamp: left out, so that croissant.json stays byte-identical
    sums = file_sums(root, skip=(RELEASE_JSON,))
    sets: list = []
    records: list = []
    for part in parts:
        s, r = _study_sets(part)
        sets += s
        records += r
    licence, citation = _licence_and_citation(facts)
    names = ", ".join(f["name"] for f in facts)
    return {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": [CONFORMS_TO, RAI_CONFORMS_TO],
        "name": slugify(f"cirval-{names}") or "cirval-release",
        "description": f"The validated items of {names}: composed image retrieval queries audited for shortcuts "
                       "and judged by annotators in CIRVal. " + " ".join(
                           f"{f['name']}: {f['validated']} validated of {f['items']} items." for f in facts),
        "license": licence,
        "citeAs": citation,
        "url": _placeholder("url"),
        "creator": {"@type": "sc:Organization", "name": _placeholder("creator")},
        "datePublished": max(s["data_as_of"] for s in release["studies"]),
        "version": "1.0.0",
        "isLiveDataset": False,
        **_rai(facts, release),
        "distribution": _file_objects(root, sums) + sets,
        "recordSet": records,
    }
