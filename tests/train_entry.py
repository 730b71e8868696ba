"""`fairseq-train` for the tests, runnable on a CPU-only torch with --fp16.

fairseq's flat fp16 path asks torch.cuda.current_device() for a device key; CPU tensors report
device.index None, so for a CPU run (a CPU-only torch, or --cpu) we answer None and the real flat
path runs; its overflow handler's ``torch.tensor(0.0).cuda()`` stays on the CPU. On a CUDA machine
without the answer, ``--fp16 --cpu`` keys the master copy by device 0 and never copies a CPU
gradient into it (fairseq's _sync_fp16_grads_to_fp32 groups them by index None): the step would
read uninitialised memory.

With RECADAM_FUSED_MIN_SEGMENT set, segments of that many elements take the fused kernel (the tiny
test model's tensors are all below the default).

With RECADAM_DUMP_DIR set, every rank writes what it ended with (model weights, optimizer state)
to RECADAM_DUMP_DIR/rank<R>.pt: fairseq itself saves checkpoints from rank 0 only.

With RECADAM_EXIT_AFTER_SAVES=N, the process dies (exit 137, as a kill) right after fairseq's N-th
checkpoint save: an interrupted run, for the resume tests.

With RECADAM_COUPLED_REFERENCE set, the coupled objective's distance is computed as it was, through autograd
(core/ewc.penalty: a graph node per tensor and operation, .item() for the log): the reference its one-node form
(core/ewc.distance) is compared with; the number of its calls is printed at exit.

With RECADAM_SAM_CHECK_RESTORE set, the SAM controller's θ is compared with the values it had before
every perturbation, bit for bit, at the next micro-batch and before the gradient reduction; the count
is printed at exit. RECADAM_SAM_POISON=3,7 makes pass 1 of those micro-batches (1-based) non-finite.
"""

import atexit
import os
import sys

import torch

if not torch.cuda.is_available() or "--cpu" in sys.argv:
    torch.cuda.current_device = lambda: None
    # fairseq's fp16 overflow handler builds torch.tensor(0.0).cuda(): on a CPU-only torch, stay on the CPU
    torch.Tensor.cuda = lambda self, *args, **kwargs: self

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


def _exit_after_saves(n):
    from fairseq import checkpoint_utils

    save, calls = checkpoint_utils.save_checkpoint, [0]

    def _save(*args, **kwargs):
        out = save(*args, **kwargs)
        calls[0] += 1
        if calls[0] >= n:
            sys.stdout.flush()
            os._exit(137)
        return out

    checkpoint_utils.save_checkpoint = _save


def _sam_test_hooks(check_restore, poison):
    """Wrap OUR controller (recadam_fairseq.core.sam_controller), not fairseq."""
    from recadam_fairseq.core.sam_controller import SAMController

    calls, checks = [0], [0]
    pass1, before_reduce = SAMController._pass1, SAMController.before_reduce

    def check(self, where):
        snap = getattr(self, "_test_snapshot", None)
        if snap is not None:
            for p, v in zip(self.params, snap):
                if not torch.equal(p, v):
                    raise AssertionError(f"sam: θ not restored bit for bit ({where})")
            checks[0] += 1

    def _pass1(self, criterion, args):
        calls[0] += 1
        check(self, "next micro-batch")
        self._test_snapshot = [p.detach().clone() for p in self.params] if check_restore else None
        if calls[0] in poison:
            scale, self.scale = self.scale, float("inf")
            try:
                return pass1(self, criterion, args)
            finally:
                self.scale = scale
        return pass1(self, criterion, args)

    def _before_reduce(self, module):
        ours = before_reduce(self, module)
        if ours:
            check(self, "all_reduce_grads")
            self._test_snapshot = None  # the step moves θ next
        return ours

    SAMController._pass1, SAMController.before_reduce = _pass1, _before_reduce
    if check_restore:
        atexit.register(lambda: print(f"sam-restore-checks {checks[0]} pass1-calls {calls[0]}", flush=True))


def _coupled_reference():
    from recadam_fairseq.core import ewc  # the module --user-dir registers: fairseq finds it in sys.modules

    calls = [0]

    def reference(pull):
        calls[0] += 1
        d = ewc.penalty(list(zip(pull.params, pull.anchors, pull.fisher or [None] * len(pull.params))))
        d.item()  # the host read the log made
        return d

    ewc.distance = reference
    atexit.register(lambda: print(f"coupled-reference-calls {calls[0]}", flush=True))  # the tests check it ran


if __name__ == "__main__":
    if os.environ.get("RECADAM_COUPLED_REFERENCE"):
        _coupled_reference()
    if os.environ.get("RECADAM_SAM_CHECK_RESTORE") or os.environ.get("RECADAM_SAM_POISON"):
        import recadam_fairseq.core.sam_controller  # noqa: F401  (the module --user-dir registers)

        _sam_test_hooks(bool(os.environ.get("RECADAM_SAM_CHECK_RESTORE")),
                        {int(x) for x in os.environ.get("RECADAM_SAM_POISON", "").split(",") if x})
    if os.environ.get("RECADAM_FUSED_MIN_SEGMENT"):
        import recadam_fairseq.core.fused  # the module --user-dir registers: fairseq finds it in sys.modules

        recadam_fairseq.core.fused.MIN_SEGMENT = int(os.environ["RECADAM_FUSED_MIN_SEGMENT"])
    if os.environ.get("RECADAM_EXIT_AFTER_SAVES"):
        _exit_after_saves(int(os.environ["RECADAM_EXIT_AFTER_SAVES"]))
    if os.environ.get("RECADAM_DUMP_DIR"):
        _dump_every_rank(os.environ["RECADAM_DUMP_DIR"])
    cli_main()
