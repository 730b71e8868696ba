"""The pretrained model of the comparison: the packaged all-MiniLM-L6-v2 converted to a fairseq RoBERTa
checkpoint (once per work directory), checked against a plain BERT forward, and its zero-shot SNLI skill."""

import json
import os

from recadam_fairseq.compare import measure
from recadam_fairseq.compare.files import read_json, write_json
from recadam_fairseq.prepare import convert_hf, hf_source, verify_hf
from recadam_fairseq.prepare.bert_forward import bert_forward, read_bert


def converted(opts):
    """(its directory, the conversion check, its arch flags): --pretrained-dir, or WORK/pretrained
    (converted there when missing)."""
    pre_dir = opts.pretrained_dir or os.path.join(opts.work, "pretrained")
    if not os.path.isfile(os.path.join(pre_dir, "model.pt")):
        print(f"== converting {opts.model_dir or hf_source.PACKAGE} -> {pre_dir}", flush=True)
        convert_hf.convert(opts.model_dir, pre_dir)
    conversion = verify_hf.verified(opts.model_dir, pre_dir)
    print(f"== conversion check: max |Δh| {conversion['abs']:.3g} (rel {conversion['rel']:.3g}); "
          f"{conversion['abs_same_eps']:.3g} with the same LayerNorm eps", flush=True)
    with open(os.path.join(pre_dir, "arch.json"), encoding="utf-8") as f:
        arch = json.load(f)["arch_args"]
    return pre_dir, conversion, arch


def baseline(opts, pretrained_dir, data):
    """Zero-shot SNLI AUC of the converted model, and of the original weights (plain BERT forward);
    kept in ``data/baseline.json`` for this model.pt (a machine without the BERT package reads it there)."""
    path = os.path.join(data, "baseline.json")
    stamp = verify_hf.model_stamp(pretrained_dir)
    cached = read_json(path)
    if cached and cached.get("model") == stamp:
        return cached["baseline"]
    out = _baseline(opts, pretrained_dir, data)
    write_json(path, {"model": stamp, "baseline": out})
    return out


def _baseline(opts, pretrained_dir, data):
    import torch

    model, _ = measure.load(os.path.join(pretrained_dir, "model.pt"), pretrained_dir)
    out = {f"snli_{k}": v for k, v in measure.snli_auc(model, os.path.join(data, "snli-bin")).items()}
    bert = read_bert(opts.model_dir or hf_source.packaged_model_dir())
    _, f2b, _ = hf_source.vocab_order(bert.vocab)
    items = measure.sentences(os.path.join(data, "snli-bin", "sentences"))
    # the same ids in BERT's numbering; [PAD] = 0 in BERT, pads are masked out
    emb = torch.empty(len(items), bert.config["hidden_size"], dtype=torch.float64)
    with torch.inference_mode():
        for rows, tokens in measure.batches(items, 128, pad=1, bos=0):
            mask = tokens.ne(1)
            h = bert_forward(bert, f2b[tokens].masked_fill(~mask, 0), mask.long(), dtype=torch.float32)[-1]
            m = mask.unsqueeze(-1).to(h.dtype)
            emb[torch.as_tensor(rows)] = ((h * m).sum(1) / m.sum(1)).double()
    out["snli_auc_bert_reference"] = measure.snli_auc(None, os.path.join(data, "snli-bin"), emb)["auc"]
    return out
