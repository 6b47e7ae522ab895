"""Database migrations of the audit app."""
