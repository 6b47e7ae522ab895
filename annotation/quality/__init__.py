"""Annotator quality: gold accuracy and the signals staff see (never the annotator)."""
