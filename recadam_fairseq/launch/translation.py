"""``scripts/seq2seq/finetune.sh METHOD``: a pretrained translation model (a fairseq transformer, BART) fine-tuned on
a language pair with one method of the catalogue (its GLUE criterion's seq2seq twin), BLEU on two validation subsets:
the new domain's and the one the model was trained on."""

import os
from typing import List

from . import recipe
from .spec import RunSpec, default_save_interval
from .variables import Variables

SCRIPT = "scripts/seq2seq/finetune.sh"


def build(v: Variables, method_arg: str, extra: List[str]) -> RunSpec:
    """The run ``seq2seq/finetune.sh METHOD EXTRA...`` makes under the variables ``v``; Stop (one line) if it cannot."""
    m = recipe.method(v, method_arg, seq2seq=True)
    lr = v.number("LR", "the learning rate") or m["METHOD_LR"] or "5e-4"
    max_tokens, beam = v.whole("MAX_TOKENS", 4096), v.whole("BEAM", 4)
    total = v.whole("MAX_UPDATE", 10000)
    seed, gpus = v.whole("SEED", 1, minimum=0), v.whole("NUM_GPUS", 1)
    src, tgt = v.get("SRC", "src"), v.get("TGT", "tgt")
    subsets = v.get("VALID_SUBSETS", "valid,test")
    warmup = v.whole("WARMUP", max(1, total * 6 // 100), minimum=0)  # WARMUP=0: none, as asked
    save_interval = v.whole("SAVE_INTERVAL_UPDATES", default_save_interval(total))

    path, data = v.get("PRETRAINED"), v.get("DATA")
    problems = []
    if not path:
        problems.append("PRETRAINED is not set: give the pretrained checkpoint, e.g. PRETRAINED=wmt19.en-de/model1.pt")
    elif not os.path.isfile(path):
        problems.append(f"PRETRAINED={path}: no such file")
    if not data:
        problems.append("DATA is not set: give the binarized pair (fairseq-preprocess --destdir)")
    else:  # fairseq names a split's files by the pair in either order
        for split in ["train"] + [s for s in subsets.split(",") if s]:
            if not any(os.path.isfile(os.path.join(data, f"{split}.{pair}.{src}.idx"))
                       for pair in (f"{src}-{tgt}", f"{tgt}-{src}")):
                problems.append(f"DATA={data} has no {split} split for {src}-{tgt} (no {data}/{split}.{src}-{tgt}.{src}.idx;"
                                f" SRC, TGT, VALID_SUBSETS name them)")
    v.problems(problems)
    pair = os.path.basename(os.path.normpath(data or "data"))
    run_dir = f"{v.get('SAVE_DIR', 'runs')}/{pair}/{m['METHOD_NAME']}/seed{seed}"  # (as the shell joined them)

    fp16_choice = v.fp16()
    ckpt = recipe.checkpoint_arch(v, path, "PRETRAINED", seq2seq=True) \
        if path and os.path.isfile(path) and not v.get("ARCH") else {}
    fp16 = recipe.fp16(v, fp16_choice)
    recipe.schedule_warnings(v, total, warmup, lr, bool(m["METHOD_RECADAM"]))
    arch_flags, _ = recipe.arch_flags(v, ckpt, "transformer")

    train = v.trainer()
    cmd = [*train, data or "", "--user-dir", v.user_dir(), "--finetune-from-model", path or "",
           "--task", "translation", "--source-lang", src, "--target-lang", tgt, "--max-tokens", str(max_tokens),
           *arch_flags, "--criterion", m["METHOD_CRITERION"], "--label-smoothing", v.get("LABEL_SMOOTHING", "0.1"),
           *m["METHOD_FLAGS"], *recipe.adam("1e-08"), "--clip-norm", "0.0", *recipe.polynomial(lr, total, warmup),
           "--eval-bleu", "--eval-bleu-args", f'{{"beam": {beam}}}',
           "--eval-bleu-detok", v.get("DETOK", "space"), "--eval-bleu-start"]
    cmd += ["--eval-bleu-remove-bpe", v.get("REMOVE_BPE")] if v.get("REMOVE_BPE") else []
    cmd += ["--fp16"] if fp16 else []
    cmd += ["--distributed-world-size", str(gpus)] if gpus != 1 else []
    cmd += ["--valid-subset", subsets] + recipe.tail(v, run_dir, seed, save_interval, "bleu",
                                                     v.get("LOG_INTERVAL", "100")) + list(extra)
    settings = f"LR={lr} MAX_TOKENS={max_tokens} TOTAL={total} WARMUP={warmup} FP16={int(fp16)} NUM_GPUS={gpus}"
    run_json = {"data": data, "method": m["METHOD"], "seed": seed, "metric": "bleu", "valid_subsets": subsets,
                "lr": lr, "total_updates": total, "warmup_updates": warmup, **m["METHOD_JSON"]}
    return RunSpec(cmd, len(train), run_dir, f"{pair} {m['METHOD']} seed {seed}",
                   settings + (f" {m['METHOD_SETTINGS']}" if m["METHOD_SETTINGS"] else ""), SCRIPT, run_json,
                   metric="bleu", end_metric="bleu", banner=f"== {pair} {m['METHOD']} seed {seed} -> {run_dir}")
