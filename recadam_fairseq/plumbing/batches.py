"""fairseq's training batches outside its Trainer: the passes a method makes over the training set before
update 1 (ChildTuning-D's and EWC's Fisher passes: ``optim/child_tuning.py``, ``criterions/fisher_source.py``)."""

import torch
from fairseq import utils


def train_batches(cfg, task, model, world: int, rank: int):
    """This rank's shard of the training set, in fairseq's batches and epoch-1 order (ChildTuning-D's and
    EWC's Fisher passes; ``cfg``: a config with ``config.TrainBatches``' fields and ``seed``)."""
    return task.get_batch_iterator(
        dataset=task.dataset(cfg.train_subset), max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), cfg.max_tokens),
        ignore_invalid_inputs=True, required_batch_size_multiple=cfg.required_batch_size_multiple,
        seed=cfg.seed, num_shards=world, shard_id=rank, num_workers=cfg.num_workers, epoch=1,
        disable_iterator_cache=True,  # not the trainer's cached iterator
    ).next_epoch_itr(shuffle=True)


def prepare(sample, device: torch.device, dtype: torch.dtype):
    """A batch as fairseq's Trainer prepares it: on the model's device, fp32 tensors in an fp16/bf16 model's dtype."""
    if device.type == "cuda":
        sample = utils.move_to_cuda(sample, device=device)
    if dtype in (torch.float16, torch.bfloat16):
        sample = utils.apply_to_sample(lambda t: t.to(dtype) if t.dtype is torch.float32 else t, sample)
    return sample
