"""Retriever specs: parsing and validation without torch.

Pure module: the standard library only (no Django, no torch, no open_clip import). The web
tier validates the audit form's retriever specs here, so that a click on "Run audit" never
loads torch into a process that serves annotators (importing open_clip costs seconds of
CPU and hundreds of MB, held for the process's life). The workers build the models
(:mod:`retrieval.encoders`, which re-exports :func:`parse_retriever_spec`).

Grammar of ``openclip:`` specs (the other prefixes, ``hf:``, ``api:``, ``composer:`` and
plugins', are parsed by their kind: :func:`retrieval.retrievers.base.parse_spec`, which
dispatches ``openclip:`` here)::

    openclip:MODEL                    random init, seed 0 (deterministic)
    openclip:MODEL@random:SEED        random init with another seed
    openclip:MODEL@TAG                open_clip pretrained tag (may download: explicit)
    openclip:MODEL@/path/to/ckpt.pt   local checkpoint (a path: contains '/' or '\\',
                                      starts with '.' or '~', or ends in .pt/.pth/
                                      .bin/.safetensors/.ckpt; or an existing
                                      file whose name is not a tag of MODEL)

MODEL is an open_clip architecture: a config file in open_clip's ``model_configs`` folder
(listed without importing the package) or one of the tiny configs shipped in
``retrieval/model_configs``. Pretrained TAGs come from ``openclip_catalog.json``, written
from the pinned open_clip by ``python -m retrieval.specs --write-catalog``; when the
installed open_clip is another version, they are read from open_clip itself.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

MODEL_CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
CATALOG = Path(__file__).resolve().parent / "openclip_catalog.json"
SPEC_PREFIX = "openclip:"
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
OPEN_CLIP_DIST = "open_clip_torch"

_SEED_RE = re.compile(r"^random(?::(-?\d+))?$")


def _open_clip_config_dir() -> Path | None:
    """open_clip's ``model_configs`` folder, found without importing the package."""
    found = importlib.util.find_spec("open_clip")
    locations = list(found.submodule_search_locations or []) if found else []
    return Path(locations[0]) / "model_configs" if locations else None


@lru_cache(maxsize=1)
def known_models() -> frozenset[str]:
    """Every open_clip architecture name a spec may use (open_clip's and CIRVal's tiny ones)."""
    folders = [d for d in (_open_clip_config_dir(), MODEL_CONFIG_DIR) if d is not None and d.is_dir()]
    return frozenset(p.stem for d in folders for p in d.glob("*.json"))


@lru_cache(maxsize=64)
def model_config(model: str) -> dict[str, Any] | None:
    """The config of open_clip architecture ``model`` as open_clip registers it (CIRVal's
    tiny configs over open_clip's own), read from its file without importing open_clip;
    ``None`` when no file names it (e.g. ``hf-hub:`` models)."""
    for folder in (MODEL_CONFIG_DIR, _open_clip_config_dir()):
        path = folder / f"{model}.json" if folder is not None and "/" not in model else None
        if path is not None and path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    return None


def installed_open_clip() -> str:
    try:
        return importlib.metadata.version(OPEN_CLIP_DIST)
    except importlib.metadata.PackageNotFoundError:
        return ""


@lru_cache(maxsize=1)
def _catalog_tags() -> dict[str, list[str]] | None:
    """The catalog's tags by model, when it was written from the installed open_clip."""
    try:
        catalog = json.loads(CATALOG.read_text())
    except (OSError, ValueError):
        return None
    if catalog.get("open_clip") != installed_open_clip():
        return None
    return catalog.get("pretrained_tags", {})


def pretrained_tags(model: str) -> list[str]:
    """open_clip's pretrained tags for ``model`` (from the catalog when it matches the install)."""
    tags = _catalog_tags()
    if tags is not None:
        return list(tags.get(model, []))
    import open_clip  # another open_clip than the catalog's: ask it (slow, but right)

    return list(open_clip.list_pretrained_tags_by_model(model))


def looks_like_path(weights: str) -> bool:
    return (
        "/" in weights
        or "\\" in weights
        or weights.startswith((".", "~"))
        or weights.lower().endswith(CHECKPOINT_SUFFIXES)
    )


def parse_retriever_spec(spec: str) -> dict[str, Any]:
    """Parse a retriever spec (grammar in the module docstring).

    Returns a dict with ``backend`` ('openclip'), ``model``, ``kind`` ('random', 'tag'
    or 'checkpoint'), ``seed`` (random only), ``tag`` (tag only), ``checkpoint``
    (absolute path, checkpoint only) and ``canonical`` (the normalised spec string).
    Raises ValueError with an explanation for anything else.

    """
    spec, model, weights = _split_spec(spec)
    try:
        parsed = weights_of(model, weights)
    except ValueError as exc:
        raise ValueError(f"bad retriever spec '{spec}': {exc}") from None
    return {"backend": "openclip", "model": model, **parsed}


def has_random_weights(spec: str) -> bool:
    """Whether the spec names no weights (no pretrained tag, no checkpoint): a model initialised at
    random, whose ranks carry no meaning (the tests' tiny configurations). A spec that no longer
    parses (a checkpoint since removed) is not called random."""
    try:
        return parse_retriever_spec(spec)["kind"] == "random"
    except ValueError:
        return False


def weights_of(model: str, weights: str | None) -> dict[str, Any]:
    """What the WEIGHTS part of a spec names, for ``model``: the one rule that the spec parser
    and :class:`retrieval.encoders.OpenClipRetriever` (its ``pretrained`` argument) share.

    Empty (or ``None``) or ``random[:SEED]``: random init. A checkpoint when the text looks
    like a path (:func:`looks_like_path`), or is an existing file and not one of the model's
    pretrained tags. Else a pretrained tag (matched case-insensitively, ``-`` as ``_``).
    Returns ``kind``, ``seed``, ``tag``, ``checkpoint`` (absolute) and ``canonical``; raises
    ValueError for a missing checkpoint, a file that is no checkpoint
    (:func:`checkpoint_format`) or an unknown tag.
    """
    weights = (weights or "").strip()
    out: dict[str, Any] = {"seed": None, "tag": None, "checkpoint": None}
    if not weights or _SEED_RE.match(weights):
        return {**out, **_random_weights(model, weights)}
    if looks_like_path(weights):
        return {**out, **_checkpoint_weights(model, weights)}
    tags = pretrained_tags(model)
    tag = weights.lower().replace("-", "_")
    if tag in tags:
        return {**out, "kind": "tag", "tag": tag, "canonical": spec_string(model, tag)}
    if Path(weights).expanduser().is_file():
        return {**out, **_checkpoint_weights(model, weights)}
    avail = ", ".join(tags) if tags else "none"
    raise ValueError(
        f"'{weights}' is not a pretrained tag of {model} (available: {avail}) and does not look like a checkpoint path"
    )


def query_key(spec: str, template_version: str, image_key: str | None, text: str | None) -> str:
    """sha256 hex naming one query of a retriever of any kind: its identity ``spec``, its prompt
    ``template_version``, the image's key (its file's sha256; ``None`` for none) and the exact text
    (``None`` for none): the embedding cache's key of a whole query (kind ``query``)."""
    payload = json.dumps([spec, template_version, image_key, text], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def spec_string(model: str, weights: Any = None) -> str:
    """``openclip:MODEL[@WEIGHTS]``: the one place a retriever spec string is written (the
    canonical spec of :func:`weights_of`, a demo model's spec, and the identity that
    :func:`retrieval.encoders.retriever_identity` keys the embedding cache with);
    :func:`parse_retriever_spec` reads it back."""
    return f"{SPEC_PREFIX}{model}" + (f"@{weights}" if weights else "")


def _split_spec(spec: Any) -> tuple[str, str, str]:
    """(spec, model, weights) of a well-formed spec naming a known open_clip model."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty retriever spec; expected e.g. 'openclip:ViT-B-32@openai'")
    spec = spec.strip()
    if not spec.startswith(SPEC_PREFIX):
        backend = spec.split(":", 1)[0] if ":" in spec else ""
        hint = f"unknown backend '{backend}'" if backend else "missing backend prefix"
        raise ValueError(f"bad retriever spec '{spec}': {hint}; expected 'openclip:MODEL[@WEIGHTS]'")
    model, sep, weights = spec[len(SPEC_PREFIX) :].partition("@")
    model, weights = model.strip(), weights.strip()
    if not model:
        raise ValueError(f"bad retriever spec '{spec}': no model name after 'openclip:'")
    if model.startswith(("hf-hub:", "local-dir:")) or ":" in model:
        raise ValueError(
            f"bad retriever spec '{spec}': schema model names ('hf-hub:', 'local-dir:') are "
            "not supported; use a built-in architecture with a tag or a checkpoint path"
        )
    known = known_models()
    if model not in known:
        close = sorted(m for m in known if m.lower() == model.lower())
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"bad retriever spec '{spec}': unknown open_clip model '{model}'{hint}")
    if sep and not weights:
        raise ValueError(f"bad retriever spec '{spec}': nothing after '@'")
    return spec, model, weights


def _random_weights(model: str, weights: str) -> dict[str, Any]:
    m = _SEED_RE.match(weights) if weights else None
    seed = int(m.group(1)) if m and m.group(1) is not None else 0
    return {"kind": "random", "seed": seed, "canonical": spec_string(model, f"random:{seed}" if seed else None)}


#: The first bytes of each checkpoint format open_clip can load: torch.save's zip archive
#: (also numpy's .npz), torch.save's older pickle, and numpy's .npy. safetensors has its own
#: test (a little-endian header length, then a JSON object).
_CHECKPOINT_MAGIC = {
    b"PK\x03\x04": "zip (torch.save or .npz)",
    b"\x80": "pickle (older torch.save)",
    b"\x93NUMPY": "numpy .npy",
}


def checkpoint_format(path: str | Path) -> str:
    """Which checkpoint format ``path`` holds, from its first bytes, without torch; raises
    ValueError for an empty file or one that no format open_clip loads begins like, so that a
    wrong file is refused when the audit is asked for, not when a worker loads it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:  # unreadable (permissions, a folder): say so, as for the rest
        raise ValueError(f"cannot read checkpoint file {path}: {exc.strerror or exc}") from None
    if not head:
        raise ValueError(f"checkpoint file is empty: {path}")
    for magic, name in _CHECKPOINT_MAGIC.items():
        if head.startswith(magic):
            return name
    if len(head) > 8 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 100_000_000:
        return "safetensors"
    raise ValueError(
        f"not a checkpoint open_clip can load (neither a torch.save file, safetensors "
        f"nor numpy): {path} begins with {head[:8]!r}"
    )


def _checkpoint_weights(model: str, weights: str) -> dict[str, Any]:
    path = Path(weights).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"checkpoint file not found: {path}")
    checkpoint_format(path)
    return {"kind": "checkpoint", "checkpoint": str(path), "canonical": spec_string(model, path)}


def live_catalog() -> dict[str, Any]:
    """The catalog as the installed open_clip reports it (imports open_clip)."""
    import open_clip

    tags = {m: list(open_clip.list_pretrained_tags_by_model(m)) for m in sorted(known_models())}
    return {"open_clip": installed_open_clip(), "pretrained_tags": {m: t for m, t in tags.items() if t}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the pretrained-tag catalog from the installed open_clip.")
    ap.add_argument("--write-catalog", action="store_true", help=f"write {CATALOG.name}")
    args = ap.parse_args(argv)
    if args.write_catalog:
        CATALOG.write_text(json.dumps(live_catalog(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {CATALOG}")
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
