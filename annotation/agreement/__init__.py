"""Inter-annotator agreement: the maths (pure), the study reports, their pages, and the CIRCUS release format."""
