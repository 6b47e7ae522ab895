"""The validated export: streamed JSONL, traces and manifest."""
