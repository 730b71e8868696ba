"""Several sentence_prediction datasets as one fairseq dataset with per-example task ids.

Task t's examples are the global indices ``offsets[t] ..``; a batch may mix tasks (validation
batches straddle task boundaries, MT-Uncertainty picks examples of any task). The collater pads
every example's tokens to one tensor and adds, beside what sentence_prediction's samples hold:

- ``task_ids``   LongTensor [B], the task of each example (its index in ``--mt-tasks``)
- ``task_index`` LongTensor [B], the example's index inside its task's dataset
- ``target``     FloatTensor [B], the label id (classification) or the score (regression)
"""

from typing import List

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils


class MultiTaskDataset(FairseqDataset):
    def __init__(self, datasets: List, task_names: List[str], pad_idx: int, split: str):
        self.datasets = datasets  # None for a task without this split (MNLI's valid1 only)
        self.task_names = task_names
        self.split = split
        self.pad_idx = pad_idx
        self.lengths = np.array([0 if d is None else len(d) for d in datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._sizes = np.concatenate([np.asarray(d.sizes[0] if isinstance(d.sizes, list) else d.sizes)
                                      for d in datasets if d is not None]).astype(np.int64)

    def locate(self, index):
        t = int(np.searchsorted(self.offsets, index, side="right") - 1)
        while self.lengths[t] == 0:  # skip empty tasks sharing the offset
            t += 1
        return t, int(index - self.offsets[t])

    def __getitem__(self, index):
        t, i = self.locate(index)
        item = self.datasets[t][i]
        return {"id": index, "task": t, "index": i, "tokens": item["net_input.src_tokens"],
                "target": item.get("target")}

    def __len__(self):
        return int(self.lengths.sum())

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return int(self._sizes[index])

    def size(self, index):
        return int(self._sizes[index])

    def ordered_indices(self):
        return np.arange(len(self))  # validation: task after task, in file order

    def collater(self, samples):
        if len(samples) == 0:
            return {}
        tokens = [s["tokens"] for s in samples]
        targets = []
        for s in samples:
            y = s["target"]
            targets.append(float(y.reshape(-1)[0]) if torch.is_tensor(y) else float(np.asarray(y).reshape(-1)[0]))
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": len(samples),
            "ntokens": sum(len(t) for t in tokens),
            "net_input": {
                "src_tokens": data_utils.collate_tokens(tokens, self.pad_idx),
                "src_lengths": torch.tensor([len(t) for t in tokens], dtype=torch.long),
            },
            "target": torch.tensor(targets, dtype=torch.float32),
            "task_ids": torch.tensor([s["task"] for s in samples], dtype=torch.long),
            "task_index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
        }

    @property
    def supports_prefetch(self):
        return False
