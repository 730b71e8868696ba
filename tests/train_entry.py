"""`fairseq-train` for the tests, runnable on a CPU-only torch with --fp16.

fairseq's flat fp16 path asks torch.cuda.current_device() for a device key; CPU tensors report
device.index None, so on a CPU-only torch we answer None and the real flat path runs.

With RECADAM_FUSED_MIN_SEGMENT set, segments of that many elements take the fused kernel (the tiny
test model's tensors are all below the default).

With RECADAM_DUMP_DIR set, every rank writes what it ended with (model weights, optimizer state)
to RECADAM_DUMP_DIR/rank<R>.pt: fairseq itself saves checkpoints from rank 0 only.
"""

import atexit
import os

import torch

if not torch.cuda.is_available():
    torch.cuda.current_device = lambda: None

from fairseq_cli.train import cli_main  # noqa: E402  (first: it sets up fairseq's log format)
from fairseq.trainer import Trainer  # noqa: E402


def _dump_every_rank(dump_dir):
    seen = []
    train_step = Trainer.train_step

    def _train_step(self, *args, **kwargs):
        if not seen:
            seen.append(self)
        return train_step(self, *args, **kwargs)

    Trainer.train_step = _train_step

    @atexit.register
    def _dump():
        if seen:
            trainer = seen[0]
            torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()},
                       os.path.join(dump_dir, f"rank{trainer.data_parallel_rank}.pt"))


if __name__ == "__main__":
    if os.environ.get("RECADAM_FUSED_MIN_SEGMENT"):
        import recadam_fairseq.fused  # the module --user-dir registers: fairseq finds it in sys.modules

        recadam_fairseq.fused.MIN_SEGMENT = int(os.environ["RECADAM_FUSED_MIN_SEGMENT"])
    if os.environ.get("RECADAM_DUMP_DIR"):
        _dump_every_rank(os.environ["RECADAM_DUMP_DIR"])
    cli_main()
