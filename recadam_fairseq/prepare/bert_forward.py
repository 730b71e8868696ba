"""The plain-torch BERT encoder, as Hugging Face's BertModel computes it in eval mode, on a BERT-family checkpoint as
hf_source.py reads it: the forgetting comparison's reference SNLI AUC of the original weights (compare/pretrained.py),
on a machine without transformers."""

from typing import List, Optional

import torch
import torch.nn.functional as F

from recadam_fairseq.prepare.hf_source import ConversionError, Source, read_model


def read_bert(model_dir: str) -> Source:
    """A BERT-family checkpoint (bert_forward's source)."""
    source = read_model(model_dir)
    if source.family != "bert":
        raise ConversionError(f"{model_dir}: a {source.config.get('model_type')} model, not BERT's family")
    return source


def bert_forward(bert: Source, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 eps: Optional[float] = None, dtype=torch.float64) -> List[torch.Tensor]:
    """Plain-torch BERT encoder (as Hugging Face's BertModel, eval mode): the hidden states of the embeddings and of
    every layer, (batch, time, dim) each, in ``dtype`` (the comparison's reference SNLI AUC of the original
    weights, compare/pretrained.py, on a machine without transformers)."""
    t, cfg = bert.tensors, bert.config
    eps = bert.eps if eps is None else eps
    w = {k: v.to(dtype) for k, v in t.items() if v.is_floating_point()}
    heads, dim = cfg["num_attention_heads"], cfg["hidden_size"]
    approximate = "none" if cfg.get("hidden_act", "gelu") == "gelu" else "tanh"  # erf GELU, or gelu_new

    def ln(x, name):
        return F.layer_norm(x, (dim,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def lin(x, name):
        return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    b, n = input_ids.shape
    x = w["embeddings.word_embeddings.weight"][input_ids] + w["embeddings.position_embeddings.weight"][:n]
    if "embeddings.token_type_embeddings.weight" in w:
        x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    states = [x]
    blocked = ~attention_mask.bool()[:, None, None, :]  # (b, 1, 1, n): keys that are padding

    def split(y):
        return y.view(b, n, heads, dim // heads).transpose(1, 2)

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (split(lin(x, p + f"attention.self.{m}")) for m in ("query", "key", "value"))
        scores = (q @ k.transpose(-1, -2)) / (dim // heads) ** 0.5
        ctx = scores.masked_fill(blocked, float("-inf")).softmax(-1) @ v
        x = ln(x + lin(ctx.transpose(1, 2).reshape(b, n, dim), p + "attention.output.dense"),
               p + "attention.output.LayerNorm")
        ffn = F.gelu(lin(x, p + "intermediate.dense"), approximate=approximate)
        x = ln(x + lin(ffn, p + "output.dense"), p + "output.LayerNorm")
        states.append(x)
    return states
