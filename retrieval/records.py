"""Normalized CIR records: what every importer produces and the loader writes.

Pure Python (no Django). One schema holds every public format without loss:
a single-turn query is a one-turn session, every source record is kept verbatim in
``QueryRecord.raw``, ids are kept as the source spells them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Files whose records are lines: messages name their records ``line N``.
LINE_FILES = (".jsonl", ".ndjson", ".txt", ".tsv")


def record_name(file: str | Any, index: int) -> str:
    """How every message names record ``index`` (0-based) of ``file``: ``line N`` for
    line-based files (JSON Lines, qrels), ``record N`` for the items of a JSON list or
    object, N counted from 1 as an editor counts."""
    is_lines = str(file).lower().endswith(LINE_FILES)
    return f"{'line' if is_lines else 'record'} {index + 1}"


class ParseError(ValueError):
    """Malformed input. Names the file, the record (:func:`record_name`: 1-based, ``line N`` in
    line-based files; :attr:`record` itself stays 0-based) and the field.

    ``record_label`` names the record where a format calls it otherwise (a CIRCUS file says
    ``assignments[N]``)."""

    def __init__(
        self, file: str, record: int | None, field_name: str | None, message: str, record_label: str | None = None
    ):
        self.file = str(file)
        self.record = record
        self.field = field_name
        self.message = message
        self.record_label = record_label
        where = self.file
        if record is not None:
            where += f", {record_label or record_name(self.file, record)}"
        if field_name:
            where += f", field '{field_name}'"
        super().__init__(f"{where}: {message}")


@dataclass(slots=True)
class ImageRecord:
    """An image of the dataset. ``external_id`` is unique within a dataset."""

    external_id: str
    path: str | None = None  # relative to the images root, POSIX separators
    url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TextRecord:
    text: str
    role: str = "caption"  # caption | caption_ext | generated | instruction
    annotator: int | None = None  # FashionIQ keeps its two captions apart
    key: str | None = None  # e.g. CIRR caption_extend key "0".."3"


@dataclass
class TurnRecord:
    index: int  # 1-based
    reference: str | None  # image external_id
    texts: list[TextRecord]
    turn_target: str | None = None  # implicit intermediate target (MT-FIQ, CIRCLED)
    provenance: str = "human"
    #: earlier turns whose images form the turn's effective reference ([]: its own reference);
    #: None: not read yet (the loader parses the texts: retrieval.sessions.session_turn_references)
    reference_turns: list[int] | None = None
    #: automatic reference checks the turn fails (retrieval.sessions.REFERENCE_CHECKS)
    reference_checks: list[str] | None = None


@dataclass
class TargetRecord:
    image: str  # image external_id
    relevance: float = 1.0
    is_primary: bool = False
    role: str = "gt"  # hard | soft | gt | pos | neg
    source_field: str = ""


#: Formats whose query ids are positions in their file (FashionIQ and Multi-turn FashionIQ
#: records carry no id: ``<category>/<split>/<ordinal>``). A re-import matches their stored
#: queries by content, not by id, so a record that only moved is unchanged (``retrieval.loader``).
POSITIONAL_ID_FORMATS = frozenset({"fashioniq", "mtfiq"})


@dataclass
class QueryRecord:
    external_id: str
    split: str
    ordinal: int  # index of the record in its source file
    source_file: str
    turns: list[TurnRecord]
    targets: list[TargetRecord]
    raw: Any  # the verbatim source record
    category: str = ""  # FashionIQ dress/shirt/toptee, CIRCLED subset
    context_text: str = ""  # CIRCO shared_concept
    tags: list[str] = field(default_factory=list)  # CIRCO semantic_aspects
    extra: dict[str, Any] = field(default_factory=dict)


def merge_image(known: ImageRecord, image: ImageRecord) -> bool:
    """Complete ``known`` from a later sighting ``image`` of the same image: a missing path or
    url, extra keys it lacks (the first values win). Returns whether ``known`` changed."""
    before = (known.path, known.url, len(known.extra))
    known.path = known.path or image.path
    known.url = known.url or image.url
    for k, v in image.extra.items():
        known.extra.setdefault(k, v)
    return (known.path, known.url, len(known.extra)) != before


#: Where a streaming parser hands the images it does not keep (see :attr:`ParsedDataset.image_sink`):
#: ``sink(split, new, changed, members)``.
ImageSink = Callable[[str, list[ImageRecord], list[ImageRecord], list[str]], None]


@dataclass
class ParsedDataset:
    """What a parser returns: images by external id, queries, galleries per split.

    A streaming import fills the same object while the parser yields its queries one by one
    (``queries`` then stays empty). Every parser refuses a query id seen twice in one split
    (across its files too), so a stream needs no loader-side check. ``touched`` lists the known images that a later sighting
    completed (a path, url or extra key added), so a loader that already wrote them can update them.

    ``image_sink``: a parser whose images may run to millions (M-BEIR candidate pools) hands
    them over in batches through :meth:`add_streamed_images`. Without a sink they land in
    ``images`` and ``galleries`` like any other; with one (the loader sets it) they go to the
    sink and only the gallery's split is noted here, with an empty member list.
    """

    format: str
    images: dict[str, ImageRecord] = field(default_factory=dict)
    queries: list[QueryRecord] = field(default_factory=list)
    galleries: dict[str, list[str]] = field(default_factory=dict)  # split -> image ids
    warnings: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    image_sink: ImageSink | None = field(default=None, repr=False, compare=False)
    #: Multi-turn FashionIQ: also store an image for every ASIN its attribute files describe
    #: (``import_dataset --attribute-images``); by default only images sessions or galleries use.
    attribute_images: bool = False
    _gallery_members: dict[str, set[str]] = field(default_factory=dict, repr=False)

    def add_image(self, image: ImageRecord) -> str:
        """Register an image once; later sightings fill in missing path/url."""
        known = self.images.get(image.external_id)
        if known is None:
            self.images[image.external_id] = image
            return image.external_id
        if merge_image(known, image):
            self.touched.add(image.external_id)
        return image.external_id

    def add_streamed_images(
        self, split: str, new: list[ImageRecord], changed: list[ImageRecord], members: list[str]
    ) -> None:
        """One batch of a streamed gallery: ``new`` images, ``changed`` ones (registered before,
        completed since, with all their values) and the ids that join the gallery of ``split``."""
        self.galleries.setdefault(split, [])
        if self.image_sink is not None:
            self.image_sink(split, new, changed, members)
            return
        for image in (*new, *changed):
            self.add_image(image)
        for image_id in members:
            self.add_to_gallery(split, image_id)

    def gallery_members(self, split: str) -> set[str]:
        """The image ids in the gallery of ``split`` (a live set: do not change it)."""
        members = self._gallery_members.get(split)
        if members is None:  # built once per split (building it on every call made galleries quadratic)
            members = self._gallery_members[split] = set(self.galleries.get(split, ()))
        return members

    def add_to_gallery(self, split: str, image_id: str) -> bool:
        """Append ``image_id`` to the gallery of ``split`` unless it is there already (False then)."""
        members = self.gallery_members(split)
        if image_id in members:
            return False
        members.add(image_id)
        self.galleries.setdefault(split, []).append(image_id)
        return True


def safe_relpath(value: Any, file: str, record: int | None, field_name: str) -> str:
    """Validate an image path from a source file and return it normalised.

    Refuses non-strings, empty strings, absolute paths and paths that climb out of the
    images root with ``..``; a leading ``./`` is dropped. Symlinks are checked later,
    against the real root, by the loader.
    """
    if not isinstance(value, str):
        raise ParseError(file, record, field_name, f"expected a path string, got {type(value).__name__}")
    text = value.strip().replace("\\", "/")
    if not text:
        raise ParseError(file, record, field_name, "empty image path")
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise ParseError(file, record, field_name, f"absolute image path {value!r} is not allowed")
    norm = posixpath.normpath(text)
    if norm == ".." or norm.startswith("../"):
        raise ParseError(file, record, field_name, f"image path {value!r} escapes the images root")
    return norm
