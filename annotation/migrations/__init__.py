"""Database migrations of the annotation app."""
