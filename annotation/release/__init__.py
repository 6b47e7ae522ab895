"""Releases: the validated files, reports, croissant.json, a dataset card and checksums in one bundle."""
