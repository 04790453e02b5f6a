"""The LLM batch-inference job kind."""
