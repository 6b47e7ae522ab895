"""The project room: staff pages to run a team without the Django admin."""
