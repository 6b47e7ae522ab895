"""The limits hostile JSON meets, wherever it comes from: request bodies
(:mod:`config.parsing`) and imported files (:mod:`retrieval.importers.jsonstream`) read them
here, so an API body and an uploaded file are refused at the same depth, the same integer
range and the same characters. Pure: the standard library only."""

from __future__ import annotations

import re

#: The deepest nesting a JSON document may have, for request bodies and imported files alike.
#: What the callers need: the deepest file of the reference formats nests 5 levels (CIRCUS's
#: manifests, Multi-turn FashionIQ's sessions; measured over /work/shared/reference); the API's
#: deepest bodies 3 (a judgement or draft with its per_turn_checks, a list of objects; quotas 2).
#: 32 leaves room for a format not seen yet and stays far below what could hurt a recursive
#: reader (``json.loads``, a serializer) or ijson's memory (it grows with the square of the
#: depth). A draft or a study's quotas deeper than this are refused as a file would be.
MAX_DEPTH = 32
#: The integer range a JSON number may have: a signed 64-bit column's.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def fits_int64(value: int) -> bool:
    """Whether ``value`` lies in :data:`INT_MIN` .. :data:`INT_MAX` (a signed 64-bit column's range)."""
    return INT_MIN <= value <= INT_MAX


#: Characters no stored text may hold: NUL (PostgreSQL refuses it in text and JSON) and lone
#: UTF-16 surrogates (they cannot be encoded as UTF-8).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_name(text: str) -> str | None:
    """``"a NUL character"`` or ``"a lone surrogate"``: the first character of ``text`` no field may
    hold; ``None`` when there is none."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"


#: Path components a refusal shows (a deeper path ends in "…"), and characters of one key.
PATH_SHOWN, KEY_SHOWN = 8, 60


def json_path(parts: list[str | int]) -> str:
    """How a refusal names a field: object keys dotted, list positions as ``[n]``
    (``img_set.members[2]``); a key's unstorable characters written as ``\\uXXXX``, a long key
    or a deep path cut with "…". Empty for the document itself."""
    shown = []
    for part in parts[:PATH_SHOWN]:
        if isinstance(part, int):
            shown.append(f"[{part}]")
        else:
            key = UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", part)
            key = key if len(key) <= KEY_SHOWN else key[:KEY_SHOWN] + "…"
            shown.append(("." if shown else "") + key)
    return "".join(shown) + ("…" if len(parts) > PATH_SHOWN else "")
