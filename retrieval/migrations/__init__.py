"""Database migrations of the retrieval app."""
