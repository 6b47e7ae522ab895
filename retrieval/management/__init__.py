"""The retrieval app's management commands (see its commands package)."""
