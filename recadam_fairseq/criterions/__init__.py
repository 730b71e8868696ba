"""fairseq criterion adapters."""
