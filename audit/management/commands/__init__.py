"""manage.py commands of audits, rank files, predictions and leaderboards."""
