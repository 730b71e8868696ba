"""fairseq task adapters."""
