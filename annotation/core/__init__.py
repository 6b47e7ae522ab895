"""Pure rules, no Django: the rubric, the quorum and consensus, session verdicts from turns,
the serve order, what an interactive round hides, the fields of an export's files. The lowest
layer of the app: the models and every sub-package read them; they import nothing above."""
