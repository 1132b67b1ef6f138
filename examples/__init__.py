"""Examples of code of your own that the pipeline runs (docs/agents.md)."""
