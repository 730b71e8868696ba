"""fairseq's side of the plug-in, shared by its components (optim/, criterions/, tasks/, models/, meters/): the
flags (config.py), the training loop as events (events.py), what is logged through fairseq's metrics
(metrics.py), the checkpoints fairseq loads (restore_check.py reads them before fairseq does; anchor_source.py:
θ* from them), fairseq's training batches outside its Trainer (batches.py), errors as one line (errors_hook.py).
No math (core/), no registered component."""
