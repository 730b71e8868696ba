"""The demo's and the tests' tiny model and data, generated on CPU where nothing can be downloaded: a tiny pretrained
RoBERTa and a GLUE-style set (``make_tiny_roberta``; its runs' commands: launch/tiny_train.py); a generated two-domain
language pair and a tiny pretrained transformer (``make_tiny_translation``), a rule-based pair over real text
(``make_text_translation``) and the two PyPI sdists' text that it and the forgetting comparison read (``text_data``).
Never imported by the plug-in."""
