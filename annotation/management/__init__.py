"""The annotation app's management commands (see its commands package)."""
