"""manage.py commands of studies, agreement, export, releases and the demo."""
