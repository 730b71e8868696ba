"""Bring a model and data: a Hugging Face BERT or RoBERTa converted to a fairseq RoBERTa checkpoint with its
dictionary and tokenizer (``convert_hf``: the source read and checked by ``hf_source``, the result compared with the
original's forward by ``verify_hf``; ``bert_forward``, the original's plain-torch forward), a labelled file of the
user's or the GLUE tasks binarized for fine-tuning (``prepare_task``, ``prepare_glue``), a forgetting-meter probe
(``binarize_probe``) and a labelled example set to ship (``example_task``). Their command lines are data-prep/*.py and
scripts/binarize_probe.py, of the same names; never imported by the plug-in."""
