"""RecAdam on translation fine-tuning, through the real fairseq-train: a tiny transformer pretrained on
one domain of a generated language pair (recadam_fairseq/tiny/make_tiny_translation.py), fine-tuned
on the other, BLEU on both domains' dev sets at every validation.

Evidence: θ* is the pretrained checkpoint tensor for tensor (shared embeddings once), in the per-tensor
and the --fp16 flat layouts; --fp16-no-flatten-grads ends bit for bit where the flat run does,
--memory-efficient-fp16 within fp16's rounding; 2 CPU ranks end where one rank with --update-freq 2 does;
a run resumed mid-epoch ends bit for bit where the whole one did; the BLEU
fairseq logs is sacrebleu's on the checkpoint's own greedy translations, recomputed here, and so is
--eval-bleu-start's BLEU at θ* (with bleu_delta = bleu − start in the json log and TensorBoard, training
unchanged by the flag, read back on resume); LLRD's scales
and ChildTuning-D's mask read off Adam's first step; the same anchors on a tiny bart_base (tied embeddings
anchored once), with SAM and EWC's task F (recomputed here); the coupled objective with EWC's task F (the
file of scripts/fisher.py) over R-Drop's doubled batches; FSAM with ChildTuning-F over samsgd
(never-kept elements stay at θ*); WiSE-FT of a translation checkpoint; bad --eval-bleu settings, GLUE
components and the methods that do not apply (ESAM, the roberta_ft flags) stop
in one line before training (in-process; one fairseq-train launch for the error hook); scripts/seq2seq/finetune.sh
resumes a killed run and ends with BLEU on both subsets and the forgetting in BLEU, which summarize.py
--forgetting-budget reads.
"""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from argparse import Namespace

import pytest
import torch

from helpers import (ONE_THREAD, USER_DIR, base_env, fast_train, json_records, launch, launch_ranks, load_ckpt,
                     load_model, one_error_line, parse_config, run_plan, trainable_names, transformer)
from recadam_fairseq.tiny import make_tiny_translation as tiny_mt

UPDATES = 8
BLEU = ["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1}), "--eval-bleu-detok", "space",
        "--valid-subset", "valid,test", "--validate-interval-updates", "4",
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


R3F = ["--criterion", "label_smoothed_cross_entropy_r3f", "--label-smoothing", "0.1", "--eps", "1e-3"]
DIST = ["--criterion", "label_smoothed_cross_entropy_recadam", "--label-smoothing", "0.1", "--dropout", "0",
        "--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 1}), "--eval-bleu-detok", "space",
        "--valid-subset", "valid,test", "--eval-bleu-start"]
RDROP = ["--criterion", "label_smoothed_cross_entropy_rdrop", "--label-smoothing", "0.1", *BLEU,
         "--save-interval-updates", "2"]


RECADAM = ["--optimizer", "recadam", "--recadam-pretrain-cof", "500", "--recadam-anneal-k", "0.5",
           "--recadam-anneal-t0", "4"]
CT_F = ["--child-tuning", "F", "--child-tuning-ratio", "0.5"]
SAM_RHO, FSAM_KEEP = 0.05, 0.1


COUPLED_EWC = ("--ewc-fisher", "task", "--ewc-fisher-examples", "16")


def finetune_args(setup, save, *extra, updates=UPDATES, validate=False, arch=tiny_mt.TINY_ARCH,
                  pretrained=None, data=None, optimizer=tuple(RECADAM)):
    return [data or os.path.join(setup, "b-bin"), "--task", "translation", *tiny_mt.LANGS, *arch,
            "--finetune-from-model", pretrained or os.path.join(setup, "pretrained.pt"), "--user-dir", USER_DIR,
            *optimizer, "--lr", "1e-3", "--lr-scheduler", "fixed",
            "--max-tokens", "512", "--max-update", str(updates), "--seed", "5", "--cpu", "--num-workers", "0",
            "--save-dir", str(save), "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "1",
            *([] if validate else ["--disable-validation"]), *extra]


def train(save, args):
    ((rc, log),) = launch(lambda _: args, save, env=ONE_THREAD, check=False)
    return rc, log


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The tiny pair and its pretrained transformer (the in-process tests need no fairseq-train run of mt's)."""
    root = tmp_path_factory.mktemp("mt")
    tiny_mt.main([str(root / "tiny"), "--pretrain-updates", "80", "--train-size", "192", "--valid-size", "24"])
    return Namespace(root=root, setup=str(root / "tiny"))


@pytest.fixture(scope="module")
def mt(pair):
    root, setup = pair.root, pair.setup
    jobs = {
        # R-Drop's seq2seq criterion, BLEU on the new domain (valid) and the original one (test), with BLEU at θ*
        # and its change (--eval-bleu-start) in the json log and TensorBoard
        "rdrop": finetune_args(setup, root / "rdrop", *RDROP, "--eval-bleu-start", "--tensorboard-logdir",
                               str(root / "tb"), validate=True),
        # the same without --eval-bleu-start, 2 updates: θ*'s validation leaves training as it was
        "rdrop_plain": finetune_args(setup, root / "rdrop_plain", *RDROP, updates=2, validate=True),
        # R3F's seq2seq criterion, --fp16: one flat fp32 tensor; the other fp16 layouts: an fp32 copy per tensor,
        # none (memory-efficient)
        "r3f_fp16": finetune_args(setup, root / "r3f_fp16", *R3F, "--fp16", updates=4),
        "r3f_fp16_pp": finetune_args(setup, root / "r3f_fp16_pp", *R3F, "--fp16", "--fp16-no-flatten-grads",
                                     updates=4),
        "r3f_mefp16": finetune_args(setup, root / "r3f_mefp16", *R3F, "--memory-efficient-fp16", updates=4),
        # one rank with --update-freq 2, the reference of the 2-rank run below (dropout off: the same computation
        # up to the order of the gradient sum); BLEU at θ* and at updates 2 and 4 (the epochs' ends)
        "dist_one": finetune_args(setup, root / "dist_one", *DIST, "--update-freq", "2", updates=4, validate=True),
        "dist_two": finetune_args(setup, root / "dist_two", *DIST, updates=4, validate=True),
        # LLRD and ChildTuning-D over the encoder's and the decoder's layers, on Adam's first step
        # (through the plug-in's seq2seq criterion, decoupled: fairseq's label_smoothed_cross_entropy)
        "llrd_cd": finetune_args(setup, root / "llrd_cd", "--criterion", "label_smoothed_cross_entropy_recadam",
                                 "--label-smoothing", "0.1", "--recadam-anneal-w", "0", "--layer-lr-decay", "0.9",
                                 "--child-tuning", "D", "--child-tuning-ratio", "0.3", updates=1),
    }
    # the coupled objective with EWC's task F (fairseq's adam, the penalty in the loss) over R-Drop's doubled
    # batches, a checkpoint at update 2
    jobs["coupled"] = finetune_args(setup, root / "coupled", "--criterion", "label_smoothed_cross_entropy_recadam",
                                    "--label-smoothing", "0.1", "--recadam-objective", "coupled", "--optimizer", "adam",
                                    "--rdrop-alpha", "1.0", *COUPLED_EWC, "--save-interval-updates", "2",
                                    "--keep-interval-updates", "-1", updates=3)
    # the pretrained checkpoint under a wider --arch: one line before training
    jobs["wider"] = finetune_args(setup, root / "wider", "--criterion", "label_smoothed_cross_entropy",
                                  "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", updates=1)
    refused = {"wider"}  # the other bad input is checked in-process (test_bleu_settings_that_fail_late_...)
    # FSAM with ChildTuning-F over samsgd (fairseq's Adam) and fairseq's criterion (SAM over RecAdam: the BART run)
    jobs["fsam_ctf"] = finetune_args(setup, root / "fsam_ctf", "--criterion", "label_smoothed_cross_entropy",
                                     "--label-smoothing", "0.1", "--sam-type", "fisher-sam", "--rho", str(SAM_RHO),
                                     "--keep-ratio", str(FSAM_KEEP), *CT_F, updates=2,
                                     optimizer=["--optimizer", "samsgd"])
    # BART (tied embeddings, layernorm_embedding, its own init): pretrained 3 updates on A, fine-tuned on B with
    # SAM and EWC's F at θ* of the first 16 training sentences (--ewc-fisher task), BLEU on both domains at the end
    bart_pre = [os.path.join(setup, "a-bin"), "--task", "translation", *tiny_mt.LANGS, *tiny_mt.TINY_BART_ARCH,
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                "--lr", "1e-2", "--max-update", "3", "--max-tokens", "512", "--seed", "1", "--cpu",
                "--num-workers", "0", "--save-dir", str(root / "bart_pre"), "--no-epoch-checkpoints",
                "--disable-validation"]
    jobs["bart"] = finetune_args(setup, root / "bart", "--criterion", "label_smoothed_cross_entropy_recadam",
                                 "--label-smoothing", "0.1", *BLEU, "--sam-type", "sam", "--rho", str(SAM_RHO),
                                 "--ewc-fisher", "task", "--ewc-fisher-examples", "16", updates=4, validate=True,
                                 arch=tiny_mt.TINY_BART_ARCH, pretrained=str(root / "bart_pre" / "checkpoint_last.pt"))

    def resumed():
        # the R-Drop run resumed from its update-2 checkpoint (mid-epoch: 4 updates an epoch), in a directory of
        # its own
        (root / "resumed").mkdir()
        shutil.copy(root / "rdrop" / "checkpoint_1_2.pt", root / "resumed" / "checkpoint_last.pt")
        shutil.copy(root / "rdrop" / "bleu_start.json", root / "resumed")  # BLEU at θ*, kept beside the checkpoints
        return train(root / "resumed", [a if a != str(root / "rdrop") else str(root / "resumed")
                                         for a in jobs["rdrop"]])

    def two_ranks():
        (rc0, log0), (rc1, log1) = launch_ranks(jobs["dist_two"], root / "dist_two", 2, env=ONE_THREAD, check=False)
        return max(rc0, rc1), log0 + "\n==== rank 1\n" + log1

    steps = {**{k: (lambda k=k, a=args: train(root / k, a)) for k, args in jobs.items()}, "resumed": resumed,
             "bart_pre": lambda: train(root / "bart_pre", bart_pre), "dist_two": two_ranks}
    # two at a time; a run that needs another's checkpoint follows it (the other pairs balance the two workers)
    out = run_plan(steps, after={"resumed": "rdrop", "bart": "bart_pre", "rdrop_plain": "r3f_fp16",
                                 "dist_one": "llrd_cd", "r3f_mefp16": "r3f_fp16_pp", "coupled": "fsam_ctf"})
    for k in steps.keys() - refused:
        assert k in out and out[k][0] == 0, f"{k}:\n{out.get(k, (0, 'not run'))[1][-4000:]}"
    return Namespace(root=root, setup=setup, runs=out)


def pretrained(mt):
    return load_ckpt(os.path.join(mt.setup, "pretrained.pt"))["model"]


def test_the_anchor_is_the_pretrained_model_tensor_for_tensor(mt):
    ckpt = mt.root / "rdrop" / "checkpoint_last.pt"
    names = trainable_names(ckpt)
    pre = pretrained(mt)
    assert "decoder.embed_tokens.weight" not in names  # shared with the encoder's: one tensor, one anchor
    state = load_ckpt(ckpt)["last_optimizer_state"]["state"]
    assert len(state) == len(names)
    for i, n in enumerate(names):
        assert torch.equal(state[i]["anchor"], pre[n]), n
    # the --fp16 run: θ* on the one flat tensor, every element anchored, as the model held it in fp16
    (st,) = load_ckpt(mt.root / "r3f_fp16" / "checkpoint_last.pt")["last_optimizer_state"]["state"].values()
    flat = torch.cat([pre[n].half().float().reshape(-1) for n in names])
    assert "anchor_runs" not in st and torch.equal(st["anchor"], flat)  # no runs: the whole tensor is anchored
    assert st["step"] == 4
    # R3F's term on a plain transformer (fairseq's rxf criterion fails there): positive at every update
    tr = json_records(mt.runs["r3f_fp16"][1], "train_inner")
    assert len(tr) == 4 and all(float(x["symm_kl"]) > 0 for x in tr)


def test_the_other_fp16_layouts_on_translation(mt):
    """--fp16-no-flatten-grads (an fp32 copy per tensor) ends bit for bit where the flat --fp16 run does, each tensor
    anchored at the pretrained one as the fp16 model held it; --memory-efficient-fp16 (no fp32 copy: the weights are
    rounded to fp16 after every step) moves the weights as the flat run does up to fp16's rounding."""
    pre = pretrained(mt)
    ckpt = {k: load_ckpt(mt.root / k / "checkpoint_last.pt") for k in ("r3f_fp16", "r3f_fp16_pp", "r3f_mefp16")}
    flat, pp, me = (ckpt[k]["model"] for k in ("r3f_fp16", "r3f_fp16_pp", "r3f_mefp16"))
    for k in flat:
        assert torch.equal(flat[k], pp[k]), k
    names = trainable_names(mt.root / "r3f_fp16_pp" / "checkpoint_last.pt")
    for run in ("r3f_fp16_pp", "r3f_mefp16"):
        state = ckpt[run]["last_optimizer_state"]["state"]
        assert len(state) == len(names) and {s["step"] for s in state.values()} == {4}, run
        for i, n in enumerate(names):
            assert torch.equal(state[i]["anchor"].float(), pre[n].half().float()), (run, n)
    body = [k for k in names if k in pre]
    d_flat = torch.cat([(flat[k].double() - pre[k].half().double()).reshape(-1) for k in body])
    d_me = torch.cat([(me[k].double() - pre[k].half().double()).reshape(-1) for k in body])
    assert d_flat.norm() > 0.01  # the weights moved
    # Adam moves each element by about lr (1e-3) per step whatever its gradient's size: where fp16's rounding of a
    # weight (2^-10 near 1, a layer norm's) is that size, or a gradient is at the rounding's noise, the runs part by
    # up to a step (measured: 0.6% of the elements beyond lr/4, 18% of ‖θ − θ*‖). A misplaced anchor changes the
    # direction of most elements' steps (γ = 500 pulls harder than the task gradient here).
    assert ((d_me - d_flat).abs() <= 0.25e-3).double().mean().item() > 0.98
    assert ((d_me - d_flat).norm() / d_flat.norm()).item() < 0.25


def test_two_cpu_ranks_equal_one_rank_with_update_freq_two(mt):
    """2 ranks (gloo) with BLEU at θ* and at each validation against one rank with --update-freq 2: the same weights
    up to the order of the gradient sum, the same anchors (the pretrained tensors); every rank measures θ*'s BLEU
    over the whole subsets, so rank 0 logs the one-rank run's start values."""
    one = load_ckpt(mt.root / "dist_one" / "checkpoint_last.pt")
    two = load_ckpt(mt.root / "dist_two" / "checkpoint_last.pt")
    pre = pretrained(mt)
    for k in one["model"]:
        assert torch.allclose(one["model"][k].double(), two["model"][k].double(), rtol=0, atol=1e-5), k
    moved = max((one["model"][k].double() - pre[k].double()).abs().max().item() for k in one["model"] if k in pre)
    assert moved > 50 * 1e-5  # the comparison is not vacuous (RecAdam's γ = 500 holds 4 updates near θ*)
    names = trainable_names(mt.root / "dist_two" / "checkpoint_last.pt")
    for run in (one, two):
        state = run["last_optimizer_state"]["state"]
        assert {s["step"] for s in state.values()} == {4}
        for i, n in enumerate(names):
            assert torch.equal(state[i]["anchor"], pre[n]), n
    start = {k: json.loads((mt.root / k / "bleu_start.json").read_text())["start"] for k in ("dist_one", "dist_two",
                                                                                            "rdrop")}
    assert start["dist_one"] == start["dist_two"] == start["rdrop"]
    for tag in ("valid", "test"):
        rows = {k: json_records(mt.runs[k][1], tag) for k in ("dist_one", "dist_two")}
        assert [int(r[f"{tag}_num_updates"]) for r in rows["dist_two"]] == [2, 4], tag  # each epoch's end
        for k, rs in rows.items():
            assert all(float(r[f"{tag}_bleu_start"]) == start["rdrop"][tag] for r in rs), (k, tag)
            assert all(float(r[f"{tag}_bleu_delta"]) == pytest.approx(float(r[f"{tag}_bleu"]) - start["rdrop"][tag],
                                                                      abs=1e-9) for r in rs), (k, tag)


def test_bart_anchor_is_its_pretrained_checkpoint_and_it_learns(mt):
    """fairseq's bart_base shape through fairseq-train (with SAM and EWC's task F): the encoder's, the decoder's and
    the output embeddings are one tensor with one anchor; every other tensor (layernorm_embedding, learned
    positions) is anchored by name; the fine-tuning moved every tensor, and BLEU is logged on both domains."""
    ckpt = mt.root / "bart" / "checkpoint_last.pt"
    names = trainable_names(ckpt)
    pre = load_ckpt(mt.root / "bart_pre" / "checkpoint_last.pt")["model"]
    now = load_ckpt(ckpt)
    tied = {"decoder.embed_tokens.weight", "decoder.output_projection.weight"}
    assert tied <= now["model"].keys() and not tied & set(names) and "encoder.embed_tokens.weight" in names
    assert torch.equal(now["model"]["decoder.output_projection.weight"], now["model"]["encoder.embed_tokens.weight"])
    assert {"encoder.layernorm_embedding.weight", "decoder.embed_positions.weight"} <= set(names)
    state = now["last_optimizer_state"]["state"]
    assert len(state) == len(names) and {s["step"] for s in state.values()} == {4}
    for i, n in enumerate(names):
        assert torch.equal(state[i]["anchor"], pre[n]), n
        assert not torch.equal(now["model"][n], pre[n]), n  # trained
    for tag in ("valid", "test"):
        (rec,) = json_records(mt.runs["bart"][1], tag)
        assert int(rec[f"{tag}_num_updates"]) == 4 and 0 <= float(rec[f"{tag}_bleu"]) <= 100


def test_a_resumed_run_ends_bit_for_bit_where_the_whole_one_did(mt):
    whole = load_ckpt(mt.root / "rdrop" / "checkpoint_last.pt")
    resumed = load_ckpt(mt.root / "resumed" / "checkpoint_last.pt")
    assert "Loaded checkpoint " in mt.runs["resumed"][1] and "(epoch 1 @ 2 updates)" in mt.runs["resumed"][1]
    for k, v in whole["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    a, b = whole["last_optimizer_state"]["state"], resumed["last_optimizer_state"]["state"]
    for i in a:
        for key in ("anchor", "exp_avg", "exp_avg_sq"):
            assert torch.equal(a[i][key], b[i][key]), (i, key)
        assert a[i]["step"] == b[i]["step"] == UPDATES
    # the BLEU of update 8 on both domains, as the whole run logged it (bleu_start from bleu_start.json, not measured
    # again)
    assert "--eval-bleu-start: BLEU at θ* from " in mt.runs["resumed"][1]
    assert "BLEU at θ* (before update 1)" not in mt.runs["resumed"][1]
    for tag in ("valid", "test"):
        assert json_records(mt.runs["resumed"][1], tag)[-1] == json_records(mt.runs["rdrop"][1], tag)[-1]


def greedy_bleu(model, task, subset):
    """sacrebleu's corpus BLEU of the model's greedy translations of a subset, as fairseq's --eval-bleu scores them."""
    import sacrebleu
    from fairseq import utils

    model.eval()
    task.load_dataset(subset)
    gen = task.build_generator([model], Namespace(beam=1))
    hyps, refs = [], []
    batches = task.get_batch_iterator(task.dataset(subset), max_tokens=4096).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    with torch.no_grad():
        for sample in batches:
            out = task.inference_step(gen, [model], sample)
            for i in range(len(out)):
                hyps.append(task.target_dictionary.string(out[i][0]["tokens"].int()))
                refs.append(task.target_dictionary.string(utils.strip_pad(sample["target"][i], pad).int(),
                                                          unk_string="UNKNOWNTOKENINREF"))
    assert len(hyps) == 24
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def test_bleu_on_both_domains_at_every_validation_is_sacrebleu_on_the_checkpoint(mt):
    log = mt.runs["rdrop"][1]
    rec = {tag: json_records(log, tag) for tag in ("valid", "test")}  # fairseq tags a subset by its name
    for tag, rows in rec.items():
        assert [int(r[f"{tag}_num_updates"]) for r in rows] == [2, 4, 6, 8], tag  # fairseq validates at every save
        assert all(0 <= float(r[f"{tag}_bleu"]) <= 100 for r in rows)
    assert float(json_records(log, "train_inner")[-1]["symm_kl"]) > 0  # R-Drop's term ran

    # the last validation saw checkpoint_last's weights: translate the original domain's dev set
    model, task = load_model(mt.root / "rdrop" / "checkpoint_last.pt")
    want = greedy_bleu(model, task, "test")
    assert want > 1  # the pretrained model translates its own domain a little
    assert float(rec["test"][-1]["test_bleu"]) == pytest.approx(want, abs=0.006)  # logged to 2 decimals


def test_bleu_at_the_start_and_its_change_in_the_json_log_and_tensorboard(mt):
    """--eval-bleu-start: each subset's BLEU at θ* is sacrebleu's on the pretrained weights' greedy translations;
    every validation logs it as bleu_start with bleu_delta = bleu − bleu_start, TensorBoard too; the measurement
    leaves training bit for bit as it was without the flag."""
    model, task = load_model(mt.root / "rdrop" / "checkpoint_last.pt")
    model.load_state_dict(pretrained(mt))
    start = json.loads((mt.root / "rdrop" / "bleu_start.json").read_text())["start"]
    assert sorted(start) == ["test", "valid"]
    log = mt.runs["rdrop"][1]
    assert "--eval-bleu-start: BLEU at θ* (before update 1)" in log
    event_acc = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    for tag in ("valid", "test"):
        assert start[tag] == pytest.approx(round(greedy_bleu(model, task, tag), 2), abs=1e-9), tag
        rows = json_records(log, tag)
        assert [float(r[f"{tag}_bleu_start"]) for r in rows] == [start[tag]] * 4, tag
        deltas = {int(r[f"{tag}_num_updates"]): float(r[f"{tag}_bleu_delta"]) for r in rows}
        for r in rows:
            assert deltas[int(r[f"{tag}_num_updates"])] == pytest.approx(float(r[f"{tag}_bleu"]) - start[tag],
                                                                         abs=1e-9)
        acc = event_acc.EventAccumulator(str(mt.root / "tb" / tag), size_guidance={"scalars": 0})
        acc.Reload()
        assert {e.step: e.value for e in acc.Scalars("bleu_start")} == pytest.approx(
            {u: start[tag] for u in deltas}, abs=1e-5), tag
        assert {e.step: e.value for e in acc.Scalars("bleu_delta")} == pytest.approx(deltas, abs=1e-5), tag
    assert any(v != 0 for v in deltas.values())  # the original domain's BLEU moved
    # θ*'s validation (its DataLoaders draw from torch's RNG) leaves training as it was
    plain = load_ckpt(mt.root / "rdrop_plain" / "checkpoint_last.pt")["model"]
    at2 = load_ckpt(mt.root / "rdrop" / "checkpoint_1_2.pt")["model"]
    for k, v in plain.items():
        assert torch.equal(v, at2[k]), k
    assert not (mt.root / "rdrop_plain" / "bleu_start.json").exists()
    assert "bleu_start" not in json_records(mt.runs["rdrop_plain"][1], "valid")[-1]


def test_llrd_and_childtuning_d_over_encoder_and_decoder_layers(mt):
    """Adam's first step moves each element by lr·scale·g/(|g|+ε): the largest move of a tensor is its lr
    scale (each stack's top layer γ = 0.9, the shared embeddings γ² one below both stacks); ChildTuning-D's
    mask leaves every other element of the layers where it was."""
    import re

    log = mt.runs["llrd_cd"][1]
    assert "--layer-lr-decay 0.9: embeddings ×0.81, encoder layers 0..0 ×0.9..×0.9, decoder layers 0..0" in log
    kept = int(re.search(r"mask from the Fisher information: ([\d,]+) of", log).group(1).replace(",", ""))
    ckpt = mt.root / "llrd_cd" / "checkpoint_last.pt"
    names = trainable_names(ckpt)
    now, pre = load_ckpt(ckpt)["model"], pretrained(mt)
    moved_in_layers = 0
    for n in names:
        d = (now[n].double() - pre[n].double()).abs()
        in_layer = ".layers." in n
        scale = 0.9 if in_layer else 0.81 if "embed_tokens" in n else 1.0
        if in_layer and d.max() == 0:  # D's mask kept none of it (k_proj.bias: no gradient, softmax's invariance)
            continue
        assert d.max().item() == pytest.approx(1e-3 * scale, rel=1e-4), n
        moved_in_layers += int((d > 0).sum()) if in_layer else 0
    assert moved_in_layers == kept
    assert {n.split(".")[0] for n in names if ".layers." in n and (now[n] != pre[n]).any()} == {"encoder", "decoder"}


def test_sam_fsam_and_childtuning_f_on_translation(mt):
    """samsgd with FSAM and ChildTuning-F, fairseq's criterion: an element ChildTuning-F never kept (its draw of
    (--seed, update), redrawn here) stays bit for bit at θ* (Adam moves it by m/√v with m = 0; SAM puts θ back
    exactly), and a kept one moves; FSAM's ε misses all but the top --keep-ratio of the eligible elements (not
    biases, not embeddings). SAM over RecAdam (the BART run): ‖ε‖ = ρ, on every element."""
    from recadam_fairseq.core import child_tuning as ct

    pre = pretrained(mt)
    ckpt = mt.root / "fsam_ctf" / "checkpoint_last.pt"
    names = trainable_names(ckpt)
    now = load_ckpt(ckpt)["model"]
    gens = [torch.Generator().manual_seed(ct.draw_seed(5, u)) for u in (0, 1)]  # --seed 5; updates done: 0, 1
    kept_once = moved = total = 0
    for n in names:  # the draws: the optimizer's tensors in order, one uniform per element, kept where u < p
        kept = (torch.rand(pre[n].numel(), generator=gens[0]) < 0.5) | (torch.rand(pre[n].numel(), generator=gens[1])
                                                                         < 0.5)
        d = (now[n] != pre[n]).reshape(-1)
        assert not (d & ~kept).any(), n
        kept_once, moved, total = kept_once + int(kept.sum()), moved + int(d.sum()), total + d.numel()
    assert 0.73 < kept_once / total < 0.77 and moved > 0.95 * kept_once  # 1 − (1/2)², and every kept one moved
    # FSAM: ε on the top ⌊keep_ratio·N⌋ of the N eligible elements and on every other tensor (biases, embeddings),
    # ρ·g/‖g‖ masked there, so ‖ε‖ < ρ; SAM: ε = ρ·g/‖g‖ on every element
    eligible = sum(pre[n].numel() for n in names if "bias" not in n and "embed" not in n)
    for run, frac, updates in (("fsam_ctf", (int(FSAM_KEEP * eligible) + total - eligible) / total, 2), ("bart", 1, 4)):
        rows = json_records(mt.runs[run][1], "train_inner")
        assert len(rows) == updates, run
        for r in rows:
            eps = float(r["sam_eps_norm"])
            assert float(r["sam_rho"]) == SAM_RHO and "sam_sharpness" in r, run
            assert eps == pytest.approx(SAM_RHO, abs=2e-6) if frac == 1 else 0 < eps < SAM_RHO - 1e-3, run
            assert float(r["sam_mask_frac"]) == pytest.approx(frac, abs=1e-6), run


def test_recadam_ewc_with_the_task_fisher_on_translation(mt):
    """--optimizer recadam --ewc-fisher task (decoupled) on translation, the BART run: F in the optimizer state is
    (1/N)·Σ_i g_i² over the first N = 16 sentences of fairseq's epoch-1 batches (--seed 5, --max-tokens 512), g_i
    the gradient at θ* of sentence i's summed token NLL (no label smoothing), recomputed here one sentence at a
    time, normalised to mean 1."""
    import torch.nn.functional as F
    from fairseq import utils

    ckpt = mt.root / "bart" / "checkpoint_last.pt"
    model, task = load_model(ckpt)
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order (tied ones once)
    model.load_state_dict(load_ckpt(mt.root / "bart_pre" / "checkpoint_last.pt")["model"])
    model.eval()
    task.load_dataset("train")
    data = task.dataset("train")
    first = next(iter(task.get_batch_iterator(
        data, max_tokens=512, max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(),
                                                                        512),
        ignore_invalid_inputs=True, required_batch_size_multiple=8, seed=5, epoch=1).next_epoch_itr(shuffle=True)))
    ids = first["id"][:16].tolist()  # the batch's order (fairseq's collater sorts it by source length)
    params = [p for p in model.parameters() if p.requires_grad]
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    pad, threads = task.target_dictionary.pad(), torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's passes: threads cost more than they give on a shared machine
    try:
        for i in ids:
            sample = data.collater([data[i]])
            logits = model(**sample["net_input"])[0].float()
            nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), sample["target"].reshape(-1), ignore_index=pad,
                                  reduction="sum")
            for acc, g in zip(sums, torch.autograd.grad(nll, params, allow_unused=True)):
                if g is not None:
                    acc += g.double() ** 2
    finally:
        torch.set_num_threads(threads)
    assert len(set(ids)) == 16 and "empirical Fisher of 16 training examples at θ*" in mt.runs["bart"][1]
    assert "per-example gradients one at a time" not in mt.runs["bart"][1]  # the vmapped pass, tied embeddings too
    mean = sum(float(x.sum()) for x in sums) / sum(x.numel() for x in sums)  # (1/N) cancels
    state = load_ckpt(ckpt)["last_optimizer_state"]["state"]
    for i, name in enumerate(names):
        assert torch.allclose(state[i]["fisher"], (sums[i] / mean).float(), rtol=1e-3, atol=1e-5), name
    assert max(float(state[i]["fisher"].max()) for i in state) > 10  # not F ≡ 1


def test_wise_ft_of_a_translation_checkpoint(mt, tmp_path):
    """scripts/interpolate.py on the R-Drop run's checkpoint: every tensor (1 − α)·θ* + α·θ_ft, the tied output
    projection with the shared embeddings; fairseq loads it as a translation model."""
    from recadam_fairseq.use import interpolate as wise

    ft_path, out = mt.root / "rdrop" / "checkpoint_last.pt", tmp_path / "wise.pt"
    assert wise.main([str(ft_path), "--pretrained", os.path.join(mt.setup, "pretrained.pt"), "--alpha", "0.25",
                      "--out", str(out)]) == 0
    ft, pre, mixed = load_ckpt(ft_path)["model"], pretrained(mt), load_ckpt(out)["model"]
    assert sorted(mixed) == sorted(ft) and sorted(pre) == sorted(ft)
    for k, v in ft.items():
        want = 0.75 * pre[k].double() + 0.25 * v.double()
        assert mixed[k].dtype == v.dtype, k  # (equal_nan: a sinusoidal embedding's uninitialised _float_tensor)
        assert torch.allclose(mixed[k].double(), want, rtol=0, atol=1e-6, equal_nan=True), k
    assert max((mixed[k] - ft[k]).abs().max().item() for k in ft) > 1e-4  # not θ_ft
    model, _ = load_model(out)
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    assert torch.equal(model.encoder.embed_tokens.weight.detach(), mixed["encoder.embed_tokens.weight"])


def test_a_checkpoint_of_another_architecture_stops_in_one_line(mt):
    msg = one_error_line(mt.runs["wider"][1])
    assert msg == (f"{os.path.join(mt.setup, 'pretrained.pt')}: the checkpoint does not fit the model --arch and its "
                   f"flags build (size mismatch for encoder.embed_tokens.weight: copying a param with shape "
                   f"torch.Size([100, 32]) from checkpoint, the shape in current model is torch.Size([100, 64])); "
                   f"give the checkpoint's architecture flags")
    assert os.listdir(mt.root / "wider") == ["train.log"]  # nothing saved (the log is the test's)


def test_the_coupled_objective_through_fairseq_train(mt):
    """fairseq's adam with the coupled criterion and EWC's --ewc-fisher task over R-Drop's doubled batches (α 1):
    θ* from --finetune-from-model; λ(t) as annealed; the logged loss λ·Loss_T + (w−λ)·penalty (Loss_T with R-Drop's
    term, per target token of the batch, not of its doubled copy); the distance the criterion logs at update 3 is
    Σ F·(θ−θ*)² of the weights update 2 saved (the tied embeddings once), F the file scripts/fisher.py writes for
    the same data, seed and 16 sentences, normalised (the Fisher passes take each sentence once, without
    R-Drop's copy)."""
    import math

    from recadam_fairseq.core import ewc
    from recadam_fairseq.tools import fisher as tool

    log = mt.runs["coupled"][1]
    assert "recadam (coupled objective): pretrained weights θ* from " in log, log[-3000:]
    inner = {int(x["num_updates"]): x for x in json_records(log, "train_inner")}
    assert sorted(inner) == [1, 2, 3]
    for n, x in inner.items():
        lam = 1 / (1 + math.exp(-0.5 * (n - 4)))
        assert float(x["recadam_lambda"]) == pytest.approx(lam, rel=1e-5)
        assert float(x["symm_kl"]) > 0  # R-Drop's two passes (dropout 0.1)
        # in bits per target token, as fairseq logs the loss (rounded to 3 decimals)
        coupled = lam * float(x["target_loss"]) + (1 - lam) * float(x["recadam_penalty"]) / math.log(2)
        assert float(x["loss"]) == pytest.approx(coupled, abs=2e-3)
    assert float(inner[1]["recadam_dist"]) == 0  # update 1's forward sees θ*
    assert float(inner[3]["recadam_penalty"]) / math.log(2) > 0.1 * float(inner[3]["loss"])  # the term weighs in
    assert "ewc: F from --ewc-fisher task (empirical Fisher of 16 training examples at θ*)" in log
    pre = pretrained(mt)
    at2 = load_ckpt(os.path.join(mt.root, "coupled", "checkpoint_1_2.pt"))["model"]
    tied = {"decoder.embed_tokens.weight", "decoder.output_projection.weight"}  # --share-all-embeddings
    out = os.path.join(mt.root, "coupled-fisher.pt")
    args = finetune_args(mt.setup, mt.root / "unused", "--criterion", "label_smoothed_cross_entropy",
                         "--label-smoothing", "0.1", "--restore-file", os.path.join(mt.setup, "pretrained.pt"))
    assert tool.main(["--out", out, "--examples", "16", "--", *args]) == 0
    raw = torch.load(out)["fisher"]  # every trainable tensor, each once
    names = list(raw)
    assert set(names) < set(pre) and not tied & set(names)
    f, _ = ewc.normalise(raw, names, "file")
    dist = sum((f[k].double() * (at2[k].double() - pre[k].double()) ** 2).sum().item() for k in names)
    plain = sum(((at2[k].double() - pre[k].double()) ** 2).sum().item() for k in names)
    assert dist > 0 and float(inner[3]["recadam_dist"]) == pytest.approx(dist, rel=1e-4)
    assert abs(dist - plain) > 1e-2 * plain  # F weighed it


def test_the_coupled_objective_as_a_seq2seq_criterion_term(tmp_path):
    """label_smoothed_cross_entropy_recadam --recadam-objective coupled, in-process on a tiny transformer: θ* is
    the model at the first training call (fairseq has loaded --restore-file there); moved off it, the loss is
    λ(1)·L_T + (w−λ(1))·γ/2·Σ(θ−θ*)²·ntokens, with L_T fairseq's label_smoothed_cross_entropy."""
    import math

    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY

    model, sample, task, _ = transformer(dropout=0.0)
    torch.save({"model": model.state_dict()}, tmp_path / "pre.pt")
    pre = {n: p.detach().clone() for n, p in model.named_parameters()}
    k, t0, gamma = 0.5, 3, 40.0
    cfg = parse_config(str(tmp_path), "--task", "translation", "--arch", "transformer", "--user-dir", USER_DIR,
                       "--optimizer", "adam", "--criterion", "label_smoothed_cross_entropy_recadam",
                       "--label-smoothing", "0.1", "--recadam-objective", "coupled", "--recadam-anneal-k", str(k),
                       "--recadam-anneal-t0", str(t0), "--recadam-pretrain-cof", str(gamma),
                       "--restore-file", str(tmp_path / "pre.pt"), "--save-dir", str(tmp_path / "run"))
    crit = CRITERION_REGISTRY["label_smoothed_cross_entropy_recadam"].build_criterion(cfg.criterion, task)
    plain_cfg = CRITERION_DATACLASS_REGISTRY["label_smoothed_cross_entropy"](sentence_avg=False, label_smoothing=0.1)
    plain = CRITERION_REGISTRY["label_smoothed_cross_entropy"].build_criterion(plain_cfg, task)
    model.train()
    lam = 1 / (1 + math.exp(-k * (1 - t0)))  # λ at update 1, w = 1
    loss, _, log = crit(model, sample)  # θ = θ*: no penalty
    assert log["recadam_dist"] == 0 and loss.item() == pytest.approx(lam * plain(model, sample)[0].item(), rel=1e-6)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    loss, n, log = crit(model, sample)
    target, n_plain, _ = plain(model, sample)
    dist = sum(((p.detach().double() - pre[name].double()) ** 2).sum() for name, p in model.named_parameters())
    want = lam * target.double() + (1 - lam) * 0.5 * gamma * dist * n
    assert n == n_plain == sample["ntokens"] and dist > 0
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    assert log["recadam_lambda"] == pytest.approx(lam) and log["recadam_dist"] == pytest.approx(dist.item(), rel=1e-6)
    assert torch.equal(log["target_loss"], target.data) and torch.equal(log["loss"], loss.data)


def test_bleu_settings_that_fail_late_or_mislead_stop_in_one_line(pair, tmp_path):
    """What fairseq-train prints as its one line (the error hook prints a ConfigError's text), in-process: the
    plug-in's seq2seq criterion reads the target dictionary (BPE without --eval-bleu-remove-bpe); a GLUE
    criterion names its seq2seq twin. (An unknown --eval-bleu-detok: test_eval_bleu_start_up_failures_...)"""
    from recadam_fairseq.core.errors import ConfigError

    # the tiny pair's dictionaries with the target words marked as subword-nmt's (setup_task reads only these)
    bpe = tmp_path / "bpe-bin"
    bpe.mkdir()
    for side in ("src", "tgt"):
        lines = open(os.path.join(pair.setup, "b-bin", f"dict.{side}.txt")).read().splitlines()
        (bpe / f"dict.{side}.txt").write_text("".join(f"{w}@@ {c}\n" if w.startswith("v") else f"{w} {c}\n"
                                                      for w, c in (ln.split() for ln in lines)))
    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--criterion", "label_smoothed_cross_entropy_recadam", "--eval-bleu",
                       data=str(bpe))
    with pytest.raises(ConfigError) as e:
        task.build_criterion(cfg.criterion)
    assert str(e.value) == (
        f"--eval-bleu: the target dictionary ({bpe / 'dict.tgt.txt'}) is subword-nmt BPE (48 of 96 symbols marked) "
        f"and no --eval-bleu-remove-bpe undoes it, so BLEU would count subword pieces; add --eval-bleu-remove-bpe subword_nmt")
    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--criterion", "sentence_prediction_r3f")
    with pytest.raises(ConfigError) as e:
        task.build_criterion(cfg.criterion)
    assert str(e.value) == (
        "--criterion sentence_prediction_r3f is a sentence-classification (GLUE) criterion; on --task translation "
        "use label_smoothed_cross_entropy_r3f")


def _start(pair, *flags, data=None):
    """fairseq-train's start in-process on the tiny pair: (cfg, task), the model not built yet."""
    from fairseq import tasks

    import recadam_fairseq
    recadam_fairseq.register()  # the plug-in's models (roberta_ft_*): its package may be imported already
    cfg = parse_config(data or os.path.join(pair.setup, "b-bin"), "--task", "translation", *tiny_mt.LANGS,
                       "--user-dir", USER_DIR, *flags)
    return cfg, tasks.setup_task(cfg.task)


@pytest.mark.parametrize("flags, message", [
    (["--eval-bleu-args", "{beam: 4}"], "--eval-bleu-args '{beam: 4}': not JSON (Expecting property name enclosed in "
                                        "double quotes at character 1); give a JSON object such as '{\"beam\": 4}'"),
    (["--eval-bleu-detok-args", "[1"], "--eval-bleu-detok-args '[1': not JSON (Expecting ',' delimiter at character "
                                       "2); give a JSON object"),
    (["--eval-bleu-detok", "nonsense"], "--eval-bleu-detok nonsense: not a detokenizer fairseq knows; choose one of "
                                        "moses, nltk, space"),
    (["--eval-bleu-detok", "moses"], "--eval-bleu-detok moses: Please install Moses tokenizer with: pip install "
                                     "sacremoses (fairseq detokenizes the translations and references before BLEU); "
                                     "--eval-bleu-detok space skips detokenizing, for text that was not tokenized"),
])
def test_eval_bleu_start_up_failures_of_fairseq_name_the_flag(pair, flags, message):
    """What fairseq's translation task raises building --eval-bleu's pieces with the model, as the hook words it."""
    from recadam_fairseq.plumbing.errors_hook import fairseq_input_error

    if "moses" in flags and importlib.util.find_spec("sacremoses") is not None:
        pytest.skip("sacremoses is installed: fairseq's moses detokenizer builds")
    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--eval-bleu", *flags)
    with pytest.raises(Exception) as e:
        task.build_model(cfg.model)
    assert fairseq_input_error(e.value) == message
    assert fairseq_input_error(ValueError("elsewhere")) is None


def test_checks_before_training_of_bleu_and_of_the_roberta_models(pair):
    """criterions/bleu_check.py on the tiny pair's task, and a roberta_ft model asked for translation."""
    from fairseq.data import Dictionary

    from recadam_fairseq.core import subwords
    from recadam_fairseq.core.errors import ConfigError
    from recadam_fairseq.criterions.bleu_check import check_bleu

    cfg, task = _start(pair, "--arch", "roberta_ft_base")
    with pytest.raises(ConfigError, match=r"^--arch roberta_ft_base: the roberta_ft models are RoBERTa encoders"):
        task.build_model(cfg.model)
    cfg, task = _start(pair, "--arch", "ca_mtl_roberta")
    with pytest.raises(ConfigError, match=r"^--arch ca_mtl_roberta: CA-MTL is a RoBERTa encoder for sentence "
                                          r"classification; --task translation needs an encoder-decoder"):
        task.build_model(cfg.model)
    check_bleu(task, "loss", False)  # no --eval-bleu, not its metric: nothing to check
    with pytest.raises(ConfigError, match=r"^--best-checkpoint-metric bleu: fairseq computes BLEU only with --eval-bleu"):
        check_bleu(task, "bleu", True)
    # --eval-bleu-start without --eval-bleu: one line when fairseq's Trainer first puts the criterion in training mode
    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--criterion", "label_smoothed_cross_entropy_rdrop",
                       "--eval-bleu-start")
    with pytest.raises(ConfigError, match=r"^--eval-bleu-start: needs --eval-bleu \(fairseq computes BLEU at "):
        task.build_criterion(cfg.criterion).train()
    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--eval-bleu")
    check_bleu(task, "bleu", True)
    check_bleu(task, "${checkpoint.best_checkpoint_metric}", "${x}")  # a config built by hand: not resolved
    with pytest.raises(ConfigError, match=r"^--best-checkpoint-metric bleu: checkpoint_best.pt would keep the lowest"):
        check_bleu(task, "bleu", False)
    task.cfg.eval_bleu_remove_bpe = "bpe"
    with pytest.raises(ConfigError, match=r"^--eval-bleu-remove-bpe 'bpe': fairseq knows 'subword_nmt', '@@ ', "):
        check_bleu(task)
    # Moses-tokenized text (its escapes in the dictionary) scored without Moses's detokenizer
    task.cfg.eval_bleu_remove_bpe = None
    task.tgt_dict = d = Dictionary()
    for w in ("the", "it", "&apos;s", "@-@"):
        d.add_symbol(w)
    with pytest.raises(ConfigError, match=r"^--eval-bleu-detok space: the target dictionary \(.*dict.tgt.txt\) holds "
                                          r"Moses's escape '&apos;s', .* add --eval-bleu-detok moses"):
        check_bleu(task)
    task.cfg.eval_bleu_detok = "moses"
    check_bleu(task)
    # the markings: SentencePiece's, subword-nmt's (and its undoing values), words
    assert subwords.marking(["\u2581the", "re", "\u2581it"]) == subwords.Marking("SentencePiece", 2, 3, ("sentencepiece",))
    assert subwords.marking(["th@@", "e", "it"]).undo == ("subword_nmt", "@@ ", "@@")
    assert subwords.marking(["w@@"] + ["w"] * 10) is None and subwords.marking([]) is None


def test_methods_that_do_not_apply_to_translation_stop_in_one_line(pair, capsys):
    """ESAM (its selection needs one loss per example) at the criterion's first training call, with samsgd built
    as fairseq-train builds it; Mixout, LoRA and re-init (flags of the roberta_ft models) in fairseq's own parser."""
    from fairseq.optim import build_optimizer

    from recadam_fairseq.core.errors import ConfigError

    cfg, task = _start(pair, *tiny_mt.TINY_ARCH, "--criterion", "label_smoothed_cross_entropy_recadam",
                       "--optimizer", "samsgd", "--sam-type", "esam", "--lr", "1e-3")
    model, crit = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])  # SAM's first-call hook
    src, tgt = torch.tensor([[5, 6, 2]]), torch.tensor([[7, 2]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3]),
                            "prev_output_tokens": torch.tensor([[2, 7]])}, "target": tgt, "ntokens": 2,
              "nsentences": 1}
    model.train()
    with pytest.raises(ConfigError) as e:
        crit(model, sample)
    assert str(e.value) == (
        "--sam-type esam: ESAM's data selection needs one loss per example, which the single-task sentence_prediction "
        "criteria give (fairseq's sentence_prediction, sentence_prediction_recadam, sentence_prediction_r3f); "
        "--criterion label_smoothed_cross_entropy_recadam does not. Use --sam-type sam/gsam/fisher-sam/fisher-gsam")
    for flags in (["--mixout", "0.9"], ["--lora-rank", "8"], ["--reinit-layers", "2"]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            _start(pair, *tiny_mt.TINY_ARCH, *flags)
        err = capsys.readouterr().err.splitlines()
        assert e.value.code == 2 and err[-1].endswith(f": error: unrecognized arguments: {' '.join(flags)}"), err


def test_the_task_script_resumes_and_ends_with_bleu_on_both_subsets(pair, tmp_path):
    """scripts/seq2seq/finetune.sh recadam-rdrop on the tiny pair, the architecture read from the checkpoint:
    killed after its first checkpoint (update 4), the same command continues from it and ends with the best
    BLEU on valid and test's BLEU at that update; a third call trains nothing."""
    script = os.path.join(os.path.dirname(USER_DIR), "scripts", "seq2seq", "finetune.sh")
    mine = ("PRETRAINED", "DATA", "SRC", "TGT", "VALID_SUBSETS", "BEAM", "DETOK", "REMOVE_BPE", "MAX_TOKENS", "WARMUP",
            "LABEL_SMOOTHING", "LOG_INTERVAL")  # the script's variables beside the GLUE scripts' (base_env drops those)
    env = {k: v for k, v in base_env().items() if k not in mine}
    env.update(base_env(PRETRAINED=os.path.join(pair.setup, "pretrained.pt"), DATA=os.path.join(pair.setup, "b-bin"),
                   SAVE_DIR=str(tmp_path), MAX_UPDATE=8, SAVE_INTERVAL_UPDATES=4, LR="1e-3", K="0.5", T0="4",
                   GAMMA="500", BEAM=1, MAX_TOKENS=512, FP16=0, FAIRSEQ_TRAIN=fast_train(),
                   OMP_NUM_THREADS=1))
    cmd = [script, "recadam-rdrop", "--cpu", "--num-workers", "0"]

    def go(**over):
        return subprocess.run(cmd, env={**env, **over}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    killed = go(RECADAM_EXIT_AFTER_SAVES="1")
    run_dir = tmp_path / "b-bin" / "recadam-rdrop-k0.5-t4-g500-a1.0" / "seed1"
    assert killed.returncode == 137 and "fairseq-train failed (exit 137)" in killed.stdout, killed.stdout[-3000:]
    resumed = go()
    out = resumed.stdout.splitlines()
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"finetune.sh: resuming {run_dir} from checkpoint_last.pt (update 4)" in out
    log = (run_dir / "train.log").read_text()
    bleu = {tag: {int(r[f"{tag}_num_updates"]): float(r[f"{tag}_bleu"]) for r in json_records(log, tag)}
            for tag in ("valid", "test")}
    delta = {tag: {int(r[f"{tag}_num_updates"]): float(r[f"{tag}_bleu_delta"]) for r in json_records(log, tag)}
             for tag in ("valid", "test")}
    assert sorted(bleu["valid"]) == sorted(bleu["test"]) == [4, 8]  # one validation before the kill, one after
    at = max(bleu["valid"], key=lambda u: (bleu["valid"][u], u))  # checkpoint_best.pt: the later of equal bests
    # BLEU at θ* (--eval-bleu-start), measured before the kill, read back by the resumed run: its change on the
    # original domain (test) is the forgetting
    assert (run_dir / "bleu_start.json").exists() and "--eval-bleu-start: BLEU at θ* from " in log
    fell = 0.0 - delta["test"][at]
    assert out[-1] == (f"== done: {run_dir} (best dev bleu {bleu['valid'][at]:g} at update {at} of 8 "
                       f"(checkpoint_best.pt), 2 validations; there: BLEU on test "
                       f"{'fell' if fell > 0 else 'rose'} by {abs(fell):.4g} since θ*, test bleu {bleu['test'][at]:g} "
                       f"({delta['test'][at]:+g} since θ*))")
    assert any(ln.startswith("  test at update 8: loss ") and f", bleu {delta['test'][8]:+.4g} since θ*" in ln
               for ln in out)  # the follower's line
    # summarize.py on the run: bleu from run.json, the forgetting in BLEU; a budget below it leaves no validation
    summarize = os.path.join(os.path.dirname(USER_DIR), "scripts", "glue", "summarize.py")
    forgot = {u: 0.0 - d for u, d in delta["test"].items()}
    for budget in (max(forgot.values()), min(forgot.values()) - 0.5):
        p = subprocess.run([sys.executable, summarize, str(tmp_path), "--out", str(tmp_path / "sum"),
                            "--forgetting-budget", str(budget)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        assert p.returncode == 0, p.stdout[-2000:]
        with open(tmp_path / "sum" / "runs.csv") as f:
            (row,) = csv.DictReader(f)
        if budget == max(forgot.values()):
            assert (row["metric"], float(row["best"]), int(row["best_update"])) == ("bleu", bleu["valid"][at], at)
            assert float(row["forgetting"]) == pytest.approx(forgot[at]) and row["forgetting_metric"] == "BLEU on test"
            md = (tmp_path / "sum" / "summary.md").read_text()  # not GLUE's page: no GLUE average, BLEU named
            assert md.startswith("# Dev results\n") and "GLUE avg" not in md and " | bleu | " in md, md
        else:
            assert row["best"] == "" and row["note"].startswith("every validation forgot more than --forgetting-budget")
    # the catalogue's seq2seq criterion and RecAdam's knobs, the checkpoint's architecture, in command.sh
    command = (run_dir / "command.sh").read_text()
    for flags in ("--criterion label_smoothed_cross_entropy_rdrop", "--rdrop-alpha 1.0", "--recadam-anneal-t0 4",
                  "--eval-bleu-start",
                  "--encoder-embed-dim 32", "--share-all-embeddings", "--valid-subset valid,test",
                  "--best-checkpoint-metric bleu"):
        assert f"  {flags} \\" in command or command.rstrip().endswith(f"  {flags}"), flags
    assert load_ckpt(run_dir / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 8
    again = go()
    score = out[-1].split(" (", 1)[1][:-1]  # said again, as when it ended
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == \
        f"== already done: {run_dir} ({score}; RESTART=1 trains it again)"
