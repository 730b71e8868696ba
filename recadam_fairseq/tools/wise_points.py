"""WiSE-FT points of a finished run with a forgetting probe (scripts/glue/summarize.py --wise-ft): the run's
weights at the validation the summary picks, mixed with θ* at each α (use/interpolate.py's mix), each scored as
the run scored itself: the dev metric through fairseq's own validation step and metrics (task.valid_step, the
criterion's reduce_metrics), the forgetting through the run's meter (meters/forgetting_meter.py's measure, against the
values at θ* the run kept in forgetting_meter.json, rounded as it logs them).

    python -m recadam_fairseq.tools.wise_points RUN_DIR CHECKPOINT --alphas 0.25 0.5 0.75

Writes RUN_DIR/wise-ft.json ({"checkpoint": name, "points": [{"alpha", "metrics", "forgetting"}, ...]}); points
already there for the same checkpoint file (its name, size and time) are kept. One line on stderr, exit 1, for a
run it cannot score (no forgetting_meter.json, a LoRA or multi-task run)."""

import argparse
import json
import os
import sys

import torch

FILE = "wise-ft.json"


def checkpoint_id(path):
    st = os.stat(path)
    return {"checkpoint": os.path.basename(path), "size": st.st_size, "mtime": int(st.st_mtime)}


def load(run_dir, checkpoint):
    """(model, task, criterion, cfg, the run's checkpoint dict, θ*'s model state, the meter, θ*'s values)."""
    from fairseq import checkpoint_utils

    import recadam_fairseq.safe_globals  # noqa: F401  (torch.load of fairseq's checkpoint types)
    from recadam_fairseq.core import probes
    from recadam_fairseq.core.anchor import load_checkpoint
    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.meters import forgetting_meter
    from recadam_fairseq.meters.measuring import read_state
    from recadam_fairseq.use import merge_lora

    saved = read_state(os.path.join(run_dir, forgetting_meter.STATE_FILE))
    if not saved or not saved.get("start"):
        raise ConfigError(f"{run_dir}: no {forgetting_meter.STATE_FILE} with values at θ* (a run with "
                          f"--forgetting-probe writes it)")
    state = load_checkpoint(checkpoint)
    if merge_lora.is_lora(state):
        raise ConfigError(f"{checkpoint}: a LoRA checkpoint (WiSE-FT points are Adam's)")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint])
    if cfg.task._name == "glue_multitask":
        raise ConfigError(f"{checkpoint}: a multi-task run (WiSE-FT points are a single task's)")
    model = models[0].eval()
    criterion = task.build_criterion(cfg.criterion)
    ident = saved["identity"]
    meter = forgetting_meter.ForgettingMeter(cfg.criterion, forgetting_meter.load_probe(ident["probe"], ident["meter"]))
    meter.task = task
    limit = model.max_positions() if hasattr(model, "max_positions") else None
    meter.items = probes.truncate(meter.data["items"], int(limit) - 1)[0] if limit else meter.data["items"]
    return model, task, criterion, cfg, state, load_checkpoint(ident["pretrained"])["model"], meter, saved["start"]


def dev_metrics(model, task, criterion, cfg):
    """{name: value} of the first valid subset, as fairseq's validation logs them (its rounding)."""
    from fairseq import utils
    from fairseq.logging import metrics

    subset = cfg.dataset.valid_subset.split(",")[0]
    if subset not in task.datasets:  # once for every α
        task.load_dataset(subset, combine=False, epoch=1, task_cfg=cfg.task)
    itr = task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=cfg.dataset.max_tokens_valid,
        max_sentences=cfg.dataset.batch_size_valid,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0).next_epoch_itr(shuffle=False)
    logs = []
    with torch.no_grad():
        for sample in itr:
            logs.append(task.valid_step(sample, model, criterion)[2])
    with metrics.aggregate(new_root=True) as agg:
        task.reduce_metrics(logs, criterion)
        return {k: float(v) for k, v in agg.get_smoothed_values().items()}


def points(run_dir, checkpoint, alphas):
    """The points at ``alphas`` (those recorded for this checkpoint kept), written to RUN_DIR/wise-ft.json."""
    from recadam_fairseq.core.forgetting import changes, forgetting
    from recadam_fairseq.core.wise_ft import check_alpha
    from recadam_fairseq.use.interpolate import interpolated_checkpoint

    alphas = [check_alpha(a) for a in alphas]
    path, ident = os.path.join(run_dir, FILE), checkpoint_id(checkpoint)
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {}
    done = {p["alpha"]: p for p in old.get("points", [])} if old.get("identity") == ident else {}
    todo = [a for a in alphas if a not in done]
    if todo:
        model, task, criterion, cfg, state, pretrained, meter, start = load(run_dir, checkpoint)
        for a in todo:
            model.load_state_dict(interpolated_checkpoint(state, pretrained, a)["model"], strict=True)
            model.eval()
            fgt = forgetting(changes(meter.measure(model), start))
            done[a] = {"alpha": a, "metrics": dev_metrics(model, task, criterion, cfg),
                       "forgetting": None if fgt is None else fgt[1]}
    out = {"identity": ident, "points": [done[a] for a in sorted(done)]}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)
    return out


def main(argv=None):
    import recadam_fairseq
    from recadam_fairseq.core.errors import ConfigError

    recadam_fairseq.register()  # the run's criterion and model may be the plug-in's (the task scripts' are)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("checkpoint", metavar="CHECKPOINT", help="the run's weights to mix (a file in RUN_DIR)")
    ap.add_argument("--alphas", type=float, nargs="+", required=True, help="weights of the run's model, in [0, 1]")
    args = ap.parse_args(argv)
    try:
        points(args.run_dir, args.checkpoint, args.alphas)
    except ConfigError as e:
        sys.exit(f"wise_points: error: {e}")  # one line on stderr, exit 1


if __name__ == "__main__":
    sys.exit(main())
