"""``scripts/glue/finetune.sh TASK METHOD``: one GLUE task (or a task of the user's) with one method, on fairseq's
RoBERTa recipe (core/glue_tasks.py) and the method's flags (catalogue.py)."""

import math
import os
from typing import List

from recadam_fairseq import catalogue
from recadam_fairseq.launch import prelaunch

from . import recipe
from .spec import RunSpec, Stop, default_save_interval
from .variables import Variables

SCRIPT = "scripts/glue/finetune.sh"
METRIC_FLAGS = {"mcc": "--report-mcc", "f1": "--report-acc-and-f1", "pearson": "--report-pearson-and-spearman"}
# R3F's RTE command (fairseq examples/rxf): lr 1e-5, batch 8, 3120 updates, 187 warmup
R3F_RTE = {"RECIPE_LR": "1e-5", "RECIPE_BATCH": 8, "RECIPE_TOTAL": 3120, "RECIPE_WARMUP": 187}


def build(v: Variables, task_arg: str, method_arg: str, extra: List[str], name_lr: bool = False,
          t0_drawn: bool = False) -> RunSpec:
    """The run ``finetune.sh TASK METHOD EXTRA...`` makes under the variables ``v``; Stop (one line) if it cannot.
    ``name_lr``: the run's name ends in its lr (a search's trials, whose lr varies: recadam-k0.1-t50-lr2e-05);
    ``t0_drawn``: T0 is each trial's own (a search's), not warned of at its default."""
    data_dir = v.get("DATA_DIR", "./glue-bin")
    m = recipe.method(v, method_arg)
    t = prelaunch.task_plan(task_arg, data_dir)
    task, name = t["TASK"], m["METHOD"]
    if m["METHOD_CRITERION"] == "sentence_prediction_r3f" and task == "RTE":
        t.update(R3F_RTE)
    # the method's own lr (LoRA's), else the recipe's
    lr = v.number("LR", "the learning rate") or m["METHOD_LR"] or str(t["RECIPE_LR"])
    criterion = v.get("CRITERION")
    if m["METHOD_CRITERION"]:
        if criterion and criterion != m["METHOD_CRITERION"]:
            raise Stop(f"METHOD {name} uses CRITERION={m['METHOD_CRITERION']}, got CRITERION={criterion}")
        criterion = m["METHOD_CRITERION"]
    criterion = criterion or "sentence_prediction_recadam"
    seed = v.whole("SEED", 1, minimum=0)
    batch = v.whole("BATCH", t["RECIPE_BATCH"])
    gpus = v.whole("NUM_GPUS", 1)
    total, warmup = int(t["RECIPE_TOTAL"]), int(t["RECIPE_WARMUP"])
    max_update = v.whole("MAX_UPDATE")
    if max_update:  # the warmup in proportion, rounded, at least 1
        warmup, total = max(1, (warmup * max_update + total // 2) // total), max_update
    save_interval = v.whole("SAVE_INTERVAL_UPDATES", default_save_interval(total))
    # joined as the shell scripts joined them (SAVE_DIR=runs/: runs//RTE/...), so that their runs resume
    named = m["METHOD_NAME"] + (f"-{catalogue.LR_TAG}{lr}" if name_lr else "")  # (parse_run_name reads it back)
    run_dir = f"{v.get('SAVE_DIR', 'runs')}/{task}/{named}/seed{seed}"

    data = f"{data_dir}/{task}-bin"
    path = v.get("ROBERTA_PATH")
    problems = []
    if not path:
        problems.append("ROBERTA_PATH is not set: give the pretrained checkpoint, e.g. ROBERTA_PATH=roberta.large/model.pt")
    elif os.path.isdir(path):
        found = sorted(f for f in os.listdir(path) if f.endswith(".pt"))
        problems.append(f"ROBERTA_PATH={path} is a directory: give the checkpoint file in it"
                        + (f", e.g. ROBERTA_PATH={os.path.join(path, found[0])}" if found else ""))
    elif not os.path.isfile(path):
        problems.append(f"ROBERTA_PATH={path}: no such file")
    if not os.path.isdir(os.path.join(data, "input0")):
        problems.append(f"no data at {data} (DATA_DIR={data_dir}): expected {data}/input0, label (see docs/glue.md)")
    v.problems(problems)

    fp16_choice = v.fp16()
    arch = v.get("ARCH")
    ckpt = {}
    if path and os.path.isfile(path) and not (arch and v.get("MAX_POSITIONS")):
        ckpt = recipe.checkpoint_arch(v, path, "ROBERTA_PATH")
    ft = bool(m["METHOD_FT"])
    if ft:  # the arch as the roberta_ft model's (re-init, LoRA)
        if arch:
            arch = prelaunch.ft_arch(arch, "ARCH")
        elif ckpt.get("CKPT_ARCH"):
            ckpt["CKPT_ARCH"] = prelaunch.ft_arch(ckpt["CKPT_ARCH"], f"ROBERTA_PATH={path}")
    per_epoch = None
    if os.path.isfile(os.path.join(data, "input0", "train.idx")):
        steps = math.ceil(prelaunch.train_examples(data_dir, task) / batch)
        per_epoch = max(1, math.ceil(steps / gpus))
    fp16 = recipe.fp16(v, fp16_choice)
    # runs that cannot learn, said before training: the recipe's 10 epochs ending before its update count on a small
    # data set, then a warmup as long as the run, RecAdam's T0 past its end
    end = total
    if not max_update and per_epoch and per_epoch * 10 < total:
        end = per_epoch * 10
        v.say(f"warning: the recipe's 10 epochs are about {end} updates on this data, not its {total}: the lr schedule "
              f"(warmup {warmup}, decay to 0 at {total}) is cut short; MAX_UPDATE={end} scales it to the data")
    recipe.schedule_warnings(v, end, warmup, lr, bool(m["METHOD_RECADAM"]) and not t0_drawn)
    arch_flags, positions = recipe.arch_flags(v, ckpt, "roberta_ft_large" if ft else "roberta_large", arch)

    train = v.trainer()
    cmd = [*train, data, "--user-dir", v.user_dir(), "--finetune-from-model", path or "",
           "--task", "sentence_prediction", "--num-classes", str(t["NUM_CLASSES"]), *recipe.TOKENS,
           "--max-positions", str(positions), *recipe.ANY_BATCH, "--batch-size", str(batch), "--max-tokens", "4400",
           *arch_flags, *recipe.DROPOUT, "--criterion", criterion, *t["TASK_FLAGS"]]
    if criterion == "sentence_prediction" and t["METRIC"] in METRIC_FLAGS:  # fairseq computes these only when asked
        cmd.append(METRIC_FLAGS[t["METRIC"]])
    cmd += [*m["METHOD_FLAGS"], *recipe.adam("1e-06"), *recipe.weight_decay("0.1", "0.0"),
            *recipe.polynomial(lr, total, warmup)]
    if not max_update:  # the recipe's 10 epochs are its update count; a MAX_UPDATE is the run's length
        cmd += ["--max-epoch", "10"]
    cmd += recipe.FP16_FLAGS if fp16 else []
    cmd.append("--find-unused-parameters")
    flags = m["METHOD_FLAGS"]
    if v.get("FORGETTING_PROBE") and criterion == "sentence_prediction" and not any(
            flags[i:i + 2] in (["--optimizer", "recadam"], ["--optimizer", "samsgd"]) for i in range(len(flags))):
        raise Stop(f"FORGETTING_PROBE needs the plug-in's criterion or optimizer, which carry the meter: "
                   f"CRITERION=sentence_prediction with METHOD {name} has neither (leave CRITERION unset)")
    meter, best = recipe.forgetting(v, t["METRIC"])
    cmd += meter + (["--distributed-world-size", str(gpus)] if gpus != 1 else [])
    cmd += recipe.tail(v, run_dir, seed, save_interval, best) + list(extra)

    settings = f"LR={lr} BATCH={batch} TOTAL={total} WARMUP={warmup} FP16={int(fp16)} NUM_GPUS={gpus}"
    run_json = {"task": task, "method": name, "seed": seed, "metric": t["METRIC"], "lr": lr, "batch": batch,
                "total_updates": total, "warmup_updates": warmup, **m["METHOD_JSON"]}
    if v.get("FORGETTING_BUDGET"):
        run_json["forgetting_budget"] = v.get("FORGETTING_BUDGET")
    return RunSpec(cmd, len(train), run_dir, f"{task} {name} seed {seed}",
                   settings + (f" {m['METHOD_SETTINGS']}" if m["METHOD_SETTINGS"] else ""), SCRIPT, run_json,
                   metric=t["METRIC"], banner=f"== {task} {name} seed {seed} -> {run_dir}")
