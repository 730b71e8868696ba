"""Every fairseq component of recadam-fairseq: importing this module registers them (once).

A new optimizer, criterion, task or model adds its import here.
"""

from . import safe_globals  # noqa: F401  (torch.load allow-list for fairseq's checkpoints)
from .plumbing import errors_hook, restore_check  # one-line errors; the checkpoints on the command line
from .criterions import sentence_prediction_recadam, sentence_prediction_r3f  # noqa: F401
from .criterions import sentence_prediction_rdrop  # noqa: F401
from .optim import fairseq_recadam  # noqa: F401
from .tasks import glue_multitask  # noqa: F401  (--task glue_multitask)
from .criterions import glue_multitask as glue_multitask_criterion  # noqa: F401  (--criterion glue_multitask)
from .models import ca_mtl_roberta, roberta_ft  # noqa: F401  (--arch ca_mtl_roberta_*, roberta_ft_*)
from .optim import samsgd  # noqa: F401
from .criterions import label_smoothed_cross_entropy_r3f, label_smoothed_cross_entropy_rdrop  # noqa: F401
from .criterions import label_smoothed_cross_entropy_recadam  # noqa: F401  (the coupled objective, seq2seq)

errors_hook.install()
restore_check.check()  # fairseq-train's checkpoints on its command line: before fairseq makes --save-dir
