"""Usage: python bench/session_checks.py [--name demo] [--retriever SPEC]

Precision and recall of the automatic session consistency checks (issue 26) on the demo's
planted session flaws, for a sweep of thresholds, from the embeddings the newest demo audit
cached (run ``make_demo`` first; the default retriever is the audit's first). The checks are
:func:`retrieval.sessions.session_consistency`; here the text directions are centred on all
the sessions' texts (the audit centres them on the texts of each session chunk). Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="demo")
    parser.add_argument("--retriever", default=None)
    parser.add_argument(
        "--direction",
        choices=["text", "composed", "image"],
        default="text",
        help="conflict directions: centred texts (the audit's), composed query minus its "
        "effective reference, or target minus effective reference (images)",
    )
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings

    from annotation.studies.truth import truth_path
    from audit.management.commands.audit_report import finished_run
    from retrieval.demo import check_session_flags
    from retrieval.embcache import EmbeddingCache
    from retrieval.encoders import build_retriever
    from retrieval.models import Target, Turn
    from retrieval.sessions import ConsistencyThresholds, effective_references, session_consistency, text_directions

    truth = json.loads(truth_path(args.name).read_text(encoding="utf-8"))["queries"]
    run = finished_run(None, args.name)
    spec = args.retriever or run.retrievers[0]
    r = build_retriever(spec, device="cpu")
    cache = EmbeddingCache(settings.EMBEDDING_CACHE_DIR, r.spec, r.dim)
    sessions: dict[str, list] = {}
    for t in (
        Turn.objects.filter(query__dataset__name=args.name, query__n_turns__gt=1)
        .select_related("query", "reference_image", "turn_target")
        .order_by("query_id", "index")
    ):
        sessions.setdefault(t.query.external_id, []).append(t)
    final = {
        q: i
        for q, i in Target.objects.filter(query__dataset__name=args.name, is_primary=True).values_list(
            "query__external_id", "image__sha256"
        )
    }
    all_texts = sorted({t.text for ts in sessions.values() for t in ts})
    txt = cache.get_many("text", all_texts).matrix
    if np.isnan(txt).any():
        sys.exit("texts missing from the cache: audit the demo first")
    directions = dict(zip(all_texts, text_directions(txt)))
    inputs = {}
    for q, ts in sessions.items():
        own = cache.get_many("image", [t.reference_image.sha256 for t in ts]).matrix
        eff = effective_references(own, [t.reference_turns for t in ts])
        shas = [t.turn_target.sha256 if t.turn_target else final[q] for t in ts]
        targets = cache.get_many("image", shas).matrix
        if args.direction == "text":
            d = np.vstack([directions[t.text] for t in ts])
        elif args.direction == "composed":
            import torch

            txt_q = torch.from_numpy(cache.get_many("text", [t.text for t in ts]).matrix).float()
            e = torch.nn.functional.normalize(torch.from_numpy(eff).float(), dim=-1)
            d = (torch.nn.functional.normalize(r.compose(e, txt_q), dim=-1) - e).numpy()
        else:
            unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
            d = unit(targets) - unit(eff)
        inputs[q] = (own[0], targets, eff, d)
    print(
        f"retriever {spec}; {len(sessions)} sessions; thresholds: noop = duplicate = circle = c_img, conflict = c_txt"
    )
    print(
        f"  {'c_img':>6}{'c_txt':>7}  "
        + "  ".join(f"{c + ' P/R':>16}" for c in ("duplicate", "circle", "conflict", "noop"))
    )
    for c_img in (0.95, 0.98, 0.99, 0.995, 0.998):
        for c_txt in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            th = ConsistencyThresholds(noop=c_img, duplicate=c_img, circle=c_img, conflict=c_txt)
            flags = {}
            for q, (start, targets, eff, d) in inputs.items():
                for n, f in enumerate(session_consistency(start, targets, eff, d, th), start=1):
                    flags[(q, n)] = f
            res = check_session_flags({q: truth[q] for q in sessions}, flags)

            def pr(x):
                p = "-" if x["precision"] is None else f"{x['precision']:.2f}"
                rc = "-" if x["recall"] is None else f"{x['recall']:.2f}"
                return f"{p}/{rc} ({x['found']})"

            print(
                f"  {c_img:>6}{c_txt:>7}  "
                + "  ".join(f"{pr(res[c]):>16}" for c in ("duplicate", "circle", "conflict", "noop"))
            )


if __name__ == "__main__":
    main()
