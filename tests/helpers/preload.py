"""What the tests' fork server (helpers/fork_server.py) imports once: torch and fairseq-train's modules. Not the
plug-in: each run imports it through --user-dir, as a fresh fairseq-train does."""

import fairseq.trainer  # noqa: F401
import fairseq_cli.train  # noqa: F401  (fairseq's tasks, models, criteria, optimizers; its log format)
import torch  # noqa: F401
