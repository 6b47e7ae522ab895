"""The fields of the files a validated export writes, named and typed once.

The export writes its query lines with these keys in this order (``MBEIR_KEYS``,
``CIRCO_KEYS``, ``CIRCLED_KEYS``), and a release's croissant.json describes its files from the
same lists (:mod:`annotation.release.croissant`): a field is added, renamed or retyped here, and
both follow. ``published``: croissant.json describes the field (a field whose values take more
than one type across datasets, such as CIRCO's image ids, COCO integers for CIRCO and strings
elsewhere, is written but not described). ``path``: a value nested in the line, as a JSON path
relative to ``column`` (``consensus`` → ``status``) or, in a JSON array file, from the root.
Pure data: no Django."""

from __future__ import annotations

from dataclasses import dataclass

TEXT, INTEGER = "text", "integer"


@dataclass(frozen=True)
class Column:
    """One field of an exported line: its name, its type, whether it is a list of that type."""

    name: str
    type: str = TEXT
    array: bool = False
    column: str = ""  # the line's key that holds it (default: ``name``)
    path: str = ""  # inside ``column``
    published: bool = True

    @property
    def key(self) -> str:
        return self.column or self.name


def keys(columns: tuple[Column, ...]) -> tuple[str, ...]:
    """The line's keys, in the order the export writes them."""
    return tuple(dict.fromkeys(c.key for c in columns))


#: An M-BEIR query line (UniIR's query layout).
MBEIR_QUERY = (
    Column("qid"),
    Column("query_txt"),
    Column("query_img_path"),
    Column("query_modality"),
    Column("query_src_content"),
    Column("pos_cand_list", array=True),
    Column("neg_cand_list", array=True),
    Column("task_id", INTEGER),
)
#: One annotation of a CIRCO val.json-style file, in the order CIRCO's file has them.
CIRCO_QUERY = (
    Column("reference_img_id", published=False),
    Column("target_img_id", published=False),
    Column("relative_caption"),
    Column("shared_concept"),
    Column("gt_img_ids", array=True, published=False),
    Column("id", INTEGER),
    Column("semantic_aspects", array=True, published=False),
)
#: A session of the CIRCLED public layout, and each of its turns (``turns``).
CIRCLED_SESSION = (
    Column("session_id"),
    Column("subset"),
    Column("ground_truth_ids", array=True, published=False),
    Column("num_turns", INTEGER),
    Column("turns", array=True, published=False),
)
CIRCLED_TURN = (Column("turn", INTEGER), Column("reference_image_id"), Column("relative_caption"))
#: What croissant.json describes of a trace line (the consensus behind each exported line).
TRACE = (
    Column("qid"),
    Column("item", INTEGER),
    Column("dataset"),
    Column("subset"),
    Column("hidden_category"),
    Column("status", column="consensus", path="status"),
    Column("policy", column="consensus", path="policy"),
    Column("n_votes", INTEGER, column="consensus", path="n_votes"),
    Column("valid_votes", INTEGER, column="consensus", path="valid_votes"),
)
#: A session study's trace line has no valid_votes of its own (its turns do).
SESSION_TRACE = tuple(c for c in TRACE if c.name != "valid_votes")
#: The positives of a query in its trace line (``positives``): labelled, or an accepted alternative.
TRACE_POSITIVES = (
    Column("images", array=True, column="positives", path="[*].image"),
    Column("sources", array=True, column="positives", path="[*].source"),
)

MBEIR_KEYS = keys(MBEIR_QUERY)
CIRCO_KEYS = keys(CIRCO_QUERY)
CIRCLED_KEYS = keys(CIRCLED_SESSION)
