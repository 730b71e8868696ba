"""What the tests' fork server (helpers/fork_server.py) imports once: torch and fairseq-train's modules, and torch's
tracing machinery (EWC's batched Fisher pass, core/per_example.py: ~2 s of imports at its first trace). Not the
plug-in: each run imports it through --user-dir, as a fresh fairseq-train does."""

import fairseq.trainer  # noqa: F401
import fairseq_cli.train  # noqa: F401  (fairseq's tasks, models, criteria, optimizers; its log format)
import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (make_fx's imports: dynamo, DTensor's op registrations, sympy)
import torch.distributed.tensor  # noqa: F401
import torch.func  # noqa: F401
import torch.fx.experimental.proxy_tensor  # noqa: F401
