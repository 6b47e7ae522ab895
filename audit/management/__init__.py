"""The audit app's management commands (see its commands package)."""
