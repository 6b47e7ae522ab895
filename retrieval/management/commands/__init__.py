"""manage.py commands of dataset imports, galleries and dataset counts."""
