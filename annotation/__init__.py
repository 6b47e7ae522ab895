"""The annotation app: studies, serving items to annotators, judgements, agreement, export and releases."""
