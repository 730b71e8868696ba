"""fairseq optimizer adapters."""
