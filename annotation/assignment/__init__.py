"""Who gets which item next: the pure assignment rules, the queue that applies them with leases, progress counts."""
