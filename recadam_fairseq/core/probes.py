"""The forgetting probes' math: what pretraining taught, measured on a fixed probe set (no fairseq import).

- :func:`mask_positions` / :func:`masked_lm`: masked-LM loss and accuracy of the model's own LM head on
  held-out sentences, with a fixed masking (sentence i: ``torch.Generator().manual_seed(i)``,
  ``randperm`` of its tokens but the final ``</s>``, the first max(1, round(0.15·n)) positions replaced
  by ``<mask>``), so every validation and every run scores the same masked tokens. The loss is in bits
  per masked token (base 2, as fairseq's masked_lm logs it).
- :func:`mean_pooled` / :func:`pair_auc`: the zero-shot sentence-pair probe of the forgetting
  comparison: the last layer's hidden states mean-pooled over each sentence, cos(premise, hypothesis)
  scoring entailment (1) against contradiction (0), as a ROC-AUC.

Sentences are 1-D LongTensors of dictionary ids ending in ``</s>`` (fairseq's binarized form); the
model is a callable on a padded (B, T) batch of ``<s> sentence`` rows.
"""

import math
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

MASK_RATE = 0.15


def pad_batch(items: Sequence[torch.Tensor], pad: int, bos: int) -> torch.Tensor:
    """(B, 1 + max len) rows ``<s> item``, right padded."""
    out = torch.full((len(items), 1 + max(len(x) for x in items)), pad, dtype=torch.long)
    for r, x in enumerate(items):
        out[r, 0] = bos
        out[r, 1:1 + len(x)] = x
    return out


def batches(items: Sequence[torch.Tensor], batch_size: int, pad: int, bos: int
            ) -> Iterator[Tuple[np.ndarray, torch.Tensor]]:
    """(row indices, padded ``<s> item`` tokens) in length order, so that little is padding."""
    order = np.argsort([len(x) for x in items], kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield rows, pad_batch([items[i] for i in rows], pad, bos)


def mask_positions(n_tokens: int, index: int, rate: float = MASK_RATE) -> torch.Tensor:
    """The masked positions (0-based, in the sentence) of sentence ``index`` of ``n_tokens`` tokens,
    its final ``</s>`` never masked; the same for every call."""
    eligible = max(n_tokens - 1, 1)
    k = max(1, int(round(rate * eligible)))
    perm = torch.randperm(eligible, generator=torch.Generator().manual_seed(index))
    return perm[:k].sort().values


def masked_lm(lm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], items: Sequence[torch.Tensor],
              mask_idx: int, pad: int, bos: int, batch_size: int = 32, device=None) -> Dict[str, float]:
    """{"loss": bits per masked token, "acc": fraction of masked tokens predicted (argmax), "tokens": count}.

    ``lm(tokens, masked)`` gives the LM head's logits at the ``masked`` (bool, B x T) positions, in
    row-major order (fairseq's RobertaModel(tokens, masked_tokens=masked))."""
    nll, correct, count = 0.0, 0, 0
    for rows, tokens in batches(items, batch_size, pad, bos):
        masked = torch.zeros_like(tokens, dtype=torch.bool)
        for r, i in enumerate(rows):
            masked[r, 1 + mask_positions(len(items[i]), int(i))] = True
        target = tokens[masked]
        inp = tokens.masked_fill(masked, mask_idx)
        if device is not None:
            inp, masked, target = inp.to(device), masked.to(device), target.to(device)
        logits = lm(inp, masked)
        logp = F.log_softmax(logits.float(), dim=-1)
        nll += float(F.nll_loss(logp, target, reduction="sum"))
        correct += int((logp.argmax(-1) == target).sum())
        count += int(target.numel())
    return {"loss": nll / max(count, 1) / math.log(2), "acc": correct / max(count, 1), "tokens": count}


def mean_pooled(encode: Callable[[torch.Tensor], torch.Tensor], items: Sequence[torch.Tensor],
                batch_size: int = 128, pad: int = 1, bos: int = 0, device=None) -> torch.Tensor:
    """(n, dim) mean of the last layer's hidden states (``encode(tokens)``: B x T x dim) over each
    sentence's tokens, ``<s>`` and ``</s>`` included, pads excluded."""
    out = None
    for rows, tokens in batches(items, batch_size, pad, bos):
        if device is not None:
            tokens = tokens.to(device)
        h = encode(tokens)
        keep = tokens.ne(pad).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1)
        if out is None:
            out = h.new_empty(len(items), h.shape[-1])
        out[torch.as_tensor(rows, device=out.device)] = pooled
    return out


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC-AUC of ``scores`` for ``labels`` 1 against 0 (Mann-Whitney: ties count 1/2)."""
    labels, scores = np.asarray(labels), np.asarray(scores, dtype=np.float64)
    pos, neg = int((labels == 1).sum()), int((labels == 0).sum())
    if pos == 0 or neg == 0:
        raise ValueError(f"the AUC needs both labels: {pos} positive, {neg} negative")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    ranks = (upper - (counts - 1) / 2.0)[inverse]  # 1-based average ranks of tied scores
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def pair_auc(embeddings: torch.Tensor, premise: np.ndarray, hypothesis: np.ndarray,
             label: np.ndarray) -> Dict[str, float]:
    """ROC-AUC of cos(premise, hypothesis) for entailment (1) vs contradiction (0), and each class's mean cos."""
    premise, hypothesis = torch.as_tensor(premise), torch.as_tensor(hypothesis)
    emb = embeddings.cpu()
    cos = F.cosine_similarity(emb[premise], emb[hypothesis], dim=-1).double().numpy()
    label = np.asarray(label)
    return {"auc": roc_auc(label, cos), "cos_entailment": float(cos[label == 1].mean()),
            "cos_contradiction": float(cos[label == 0].mean())}


def truncate(items: List[torch.Tensor], max_tokens: int) -> Tuple[List[torch.Tensor], int]:
    """Sentences cut to ``max_tokens`` (their last kept token set to the final one, ``</s>``); how many were cut."""
    out, cut = [], 0
    for x in items:
        if len(x) > max_tokens:
            x = torch.cat([x[:max_tokens - 1], x[-1:]])
            cut += 1
        out.append(x)
    return out, cut
