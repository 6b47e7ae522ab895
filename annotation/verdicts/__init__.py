"""Deciding items: consensus policies (pure) and the adjudication queue."""
