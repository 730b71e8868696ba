"""fairseq model adapters."""
