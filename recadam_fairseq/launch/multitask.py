"""``scripts/glue/multitask.sh``: one RoBERTa on several GLUE tasks at once (CA-MTL's setting, --task glue_multitask),
the paper's settings over fairseq's RoBERTa recipe."""

import os
from typing import List

from recadam_fairseq.launch import prelaunch

from . import recipe
from .spec import RunSpec, default_save_interval
from .variables import Variables

SCRIPT = "scripts/glue/multitask.sh"
SAMPLINGS = ["sequential", "uniform", "proportional", "uncertainty"]


def build(v: Variables, extra: List[str]) -> RunSpec:
    """The run ``multitask.sh EXTRA...`` makes under the variables ``v``; Stop (one line) if it cannot."""
    tasks_arg = v.get("TASKS", "CoLA,SST-2,MRPC,QQP,STS-B,MNLI,QNLI,RTE")
    sampling = v.choice("SAMPLING", "uncertainty", SAMPLINGS,
                        "unknown SAMPLING '{value}'; choose one of " + " ".join(SAMPLINGS))
    lr, freeze = v.number("LR", "the learning rate") or "2e-5", v.get("FREEZE", "lower")
    data_dir = v.get("DATA_DIR", "./glue-bin")
    fp16_choice = v.fp16()
    batch, epochs, gpus = v.whole("BATCH", 32), v.whole("EPOCHS", 5), v.whole("NUM_GPUS", 1)
    seed = v.whole("SEED", 1, minimum=0)
    path = v.get("ROBERTA_PATH")
    if not path or not os.path.isfile(path):
        v.problems([f"ROBERTA_PATH='{path or ''}': give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.base/model.pt"])
        path = None

    # task names in GLUE's spelling, updates per epoch (every sampling mode takes sum_t ceil(n_t / BATCH) batches,
    # shared by the GPUs), the checkpoint's architecture, FREEZE checked against the model's layers
    m = recipe.method(v, v.get("METHOD", "adam"), multitask=True)
    names = prelaunch.task_names(tasks_arg, data_dir)
    tasks = ",".join(names)
    if v.dry_run and not os.path.isdir(data_dir):
        per_epoch = 1000
        v.say(f"warning: no {data_dir}; assuming {per_epoch} updates per epoch")
    else:
        per_epoch = prelaunch.per_epoch(data_dir, names, batch, gpus)
    ckpt = recipe.checkpoint_arch(v, path, "ROBERTA_PATH") if path else {}
    arch = v.get("ARCH")
    if freeze != "none" and ckpt:  # (a dry run that could not read the checkpoint does not know its layers)
        layers = ckpt.get("CKPT_LAYERS")
        if arch:
            layers = prelaunch.arch_defaults(arch).get("encoder_layers", layers)
        prelaunch.check_freeze(freeze, layers)
    fp16 = recipe.fp16(v, fp16_choice)
    arch_flags, positions = recipe.arch_flags(v, ckpt, "roberta_base")

    total = per_epoch * epochs
    warmup = max(1, total // 10)
    recipe.schedule_warnings(v, total, warmup, lr, bool(m["METHOD_RECADAM"]))
    save_interval = v.whole("SAVE_INTERVAL_UPDATES", default_save_interval(total))
    name = f"{arch or arch_flags[1]}-{sampling}-{m['METHOD_NAME']}"  # the method with its knobs: a K sweep's runs apart
    save_dir = v.get("SAVE_DIR", "runs")
    run_dir = f"{save_dir}/MTL/{name}/seed{seed}"  # (as the shell joined them: their runs resume)

    train = v.trainer()
    cmd = [*train, data_dir, "--user-dir", v.user_dir(), "--finetune-from-model", path or v.get("ROBERTA_PATH", ""),
           "--task", "glue_multitask", "--mt-tasks", tasks, "--mt-sampling", sampling, "--criterion", "glue_multitask",
           *recipe.TOKENS, "--max-positions", str(positions), *arch_flags, *recipe.DROPOUT, "--batch-size", str(batch),
           *recipe.ANY_BATCH, "--max-epoch", str(epochs), *m["METHOD_FLAGS"], *recipe.adam("1e-06"),
           *recipe.weight_decay("0.1", "0.0"), *recipe.polynomial(lr, total, warmup)]
    cmd += ["--freeze-encoder-layers", freeze] if freeze != "none" else []
    cmd += recipe.FP16_FLAGS if fp16 else []
    cmd += ["--distributed-world-size", str(gpus)] if gpus != 1 else []
    cmd += ["--valid-subset", "valid,valid1"] if "MNLI" in names else []  # MNLI-mm as valid1
    meter, best = recipe.forgetting(v, "glue_avg")
    cmd += meter + ["--find-unused-parameters"] + recipe.tail(v, run_dir, seed, save_interval, best) + list(extra)
    return RunSpec(cmd, len(train), run_dir, f"multi-task {tasks} ({sampling}, {name}) seed {seed}",
                   f"LR={lr} BATCH={batch} EPOCHS={epochs} TOTAL={total} WARMUP={warmup} FP16={int(fp16)} "
                   f"FREEZE={freeze}", SCRIPT, metric="glue_avg",
                   banner=f"== multi-task {tasks} ({sampling}, {name}, {m['METHOD']}) seed {seed} -> {run_dir}",
                   after=f"== (python scripts/glue/summarize.py {save_dir})")
