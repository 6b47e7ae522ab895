"""The retrieval app: the CIR corpus (datasets, images, queries, targets), importers, ranking, metrics and the job framework."""
