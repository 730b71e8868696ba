"""``--task glue_multitask``: one model trained on several GLUE tasks at once (CA-MTL's setting).

The data path is the directory holding the ``<TASK>-bin`` directories written by
``data-prep/prepare_glue.py``; ``--mt-tasks CoLA,SST-2,STS-B`` picks among them. A name that is
not a GLUE task is a user's own task when ``<data>/<NAME>-bin/labels.json`` exists
(``{"task": NAME, "num_classes": K}`` or ``{"task": NAME, "regression": true}``) beside
fairseq-preprocess's ``sentence_prediction`` layout (``input0/``, ``input1/`` for pairs, ``label/``).
Each task is loaded by fairseq's own ``sentence_prediction`` task (same files, same token layout)
and gets its own classification head (``head_name``; one output for a regression). Batches are
drawn by ``--mt-sampling`` (``mt_sampling.py``); validation runs every task's dev set and the
criterion ``glue_multitask`` logs each task's GLUE metric and their average ``glue_avg``.

Also here, because they must hold for any encoder (``roberta_*``, ``ca_mtl_roberta_*``):
``--freeze-encoder-layers`` / ``--freeze-embeddings`` (frozen tensors get ``requires_grad=False``,
so fairseq never hands them to the optimizer).
"""

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from fairseq.data import iterators
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from omegaconf import II, MISSING, OmegaConf, open_dict

from ..core import mt_sampling as sampling
from ..core import glue_tasks
from ..core.errors import ConfigError
from ..core.glue_tasks import head_name
from ..core.layers import parse_layers
from ..criterions.label_check import check_labels
from ..plumbing.config import redefault
from .multitask_data import MultiTaskDataset

logger = logging.getLogger(__name__)

class MultiTaskError(ConfigError):
    """Bad multi-task input; raised before training starts."""


@dataclass
class GlueMultitaskConfig(FairseqDataclass):
    data: str = field(default=MISSING, metadata={"help": "directory holding the <TASK>-bin directories "
                                                         "written by data-prep/prepare_glue.py (and your own "
                                                         "<NAME>-bin directories)"})
    mt_tasks: str = field(default="", metadata={"help": "comma-separated tasks to train on together: GLUE tasks "
                                                        "(case-insensitive), e.g. CoLA,SST-2,STS-B, or your own "
                                                        "NAME with <data>/NAME-bin/labels.json; the task id "
                                                        "of a task is its position in this list"})
    mt_sampling: ChoiceEnum(sampling.MODES) = field(
        default="sequential",
        metadata={"help": "which task each batch comes from: sequential (task after task), uniform, "
                          "proportional (to dataset size^(1/--mt-temperature)), uncertainty (MT-Uncertainty: "
                          "a candidate batch of every task, keep the --batch-size most uncertain examples)"})
    mt_temperature: float = field(default=1.0, metadata={"help": "temperature τ of --mt-sampling proportional: "
                                                                 "task t drawn ∝ n_t^(1/τ)"})
    freeze_encoder_layers: str = field(default="", metadata={"help": "encoder layers to freeze: lower (the lower half, "
                                                                     "CA-MTL's choice: 0-5 of base), 0-5, 0-2,7, all, "
                                                                     "upper, top; empty: none"})
    freeze_embeddings: bool = field(default=False, metadata={"help": "freeze the token and position embeddings "
                                                                     "and the embedding layer norm"})
    # sentence_prediction's own flags (each task is loaded by it)
    init_token: Optional[int] = redefault(SentencePredictionConfig, "init_token", 0)
    separator_token: Optional[int] = redefault(SentencePredictionConfig, "separator_token", 2)
    max_positions: int = redefault(SentencePredictionConfig, "max_positions")
    seed: int = II("common.seed")
    train_subset: str = II("dataset.train_subset")


@register_task("glue_multitask", dataclass=GlueMultitaskConfig)
class GlueMultitaskTask(FairseqTask):
    cfg: GlueMultitaskConfig

    def __init__(self, cfg, dictionary, subtasks, metas):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.subtasks = subtasks  # fairseq SentencePredictionTask per task, sharing `dictionary`
        self.metas = metas  # labels.json per task
        self.mt_task_names = [m["name"] for m in metas]
        self.num_classes = [m["num_classes"] for m in metas]
        self.regression = [m["regression"] for m in metas]
        self.batch_size = None  # --batch-size: MT-Uncertainty keeps this many candidates

    # ----------------------------------------------------------------- set-up
    @staticmethod
    def head_name(name: str) -> str:
        return head_name(name)

    @property
    def head_names(self) -> List[str]:
        return [head_name(n) for n in self.mt_task_names]

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        if not os.path.isdir(cfg.data):
            raise MultiTaskError(f"data directory {cfg.data} does not exist (expected the <TASK>-bin directories "
                                 "written by data-prep/prepare_glue.py)")
        names = parse_task_names(cfg.mt_tasks, cfg.data)
        if str(cfg.mt_sampling) not in sampling.MODES:
            raise MultiTaskError(f"--mt-sampling {cfg.mt_sampling}: unknown, choose one of {', '.join(sampling.MODES)}")
        if not cfg.mt_temperature > 0:
            raise MultiTaskError(f"--mt-temperature must be > 0, got {cfg.mt_temperature}")
        dirs = [os.path.join(cfg.data, f"{n}-bin") for n in names]
        for n, d in zip(names, dirs):
            if not os.path.isfile(os.path.join(d, "input0", "dict.txt")):
                make = (f"make it with data-prep/prepare_glue.py --tasks {n}" if n in glue_tasks.TASKS else
                        "binarize the first sentences with fairseq-preprocess --only-source --srcdict <the RoBERTa "
                        f"dict.txt> --destdir {d}/input0")
                raise MultiTaskError(f"--mt-tasks {n}: no task directory {d} (expected {d}/input0/dict.txt; {make})")
        check_same_dictionary(dirs)
        dictionary = SentencePredictionTask.load_dictionary(os.path.join(dirs[0], "input0", "dict.txt"))
        subtasks, metas = [], []
        for n, d in zip(names, dirs):
            meta = read_labels_json(n, d)
            label_path = os.path.join(d, "label", "dict.txt")
            if not meta["regression"] and not os.path.isfile(label_path):
                raise MultiTaskError(f"--mt-tasks {n}: {label_path} is missing (the labels, binarized with "
                                     "fairseq-preprocess --only-source --destdir " + os.path.join(d, "label") + ")")
            sub_cfg = SentencePredictionConfig(
                data=d, num_classes=meta["num_classes"], init_token=cfg.init_token,
                separator_token=cfg.separator_token, no_shuffle=True, max_positions=cfg.max_positions,
                regression_target=meta["regression"], classification_head_name=head_name(n), seed=cfg.seed)
            label_dict = dictionary if meta["regression"] else SentencePredictionTask.load_dictionary(
                os.path.join(d, "label", "dict.txt"))
            subtasks.append(SentencePredictionTask(sub_cfg, dictionary, label_dict))
            check_labels(subtasks[-1], flag=f"{os.path.join(d, 'labels.json')} num_classes")
            metas.append(meta)
        logger.info("glue_multitask: " + ", ".join(
            f"{m['name']} (id {i}, head {head_name(m['name'])}, "
            f"{'regression' if m['regression'] else str(m['num_classes']) + ' classes'})" for i, m in enumerate(metas))
            + f"; dictionary {len(dictionary)} types; sampling {cfg.mt_sampling}")
        return cls(cfg, dictionary, subtasks, metas)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        parts = []
        for sub in self.subtasks:
            has = os.path.exists(os.path.join(sub.cfg.data, "input0", f"{split}.idx"))
            parts.append(sub.load_dataset(split, combine=combine) if has else None)
        if all(p is None for p in parts):
            raise FileNotFoundError(f"glue_multitask: no task of --mt-tasks has a {split!r} split "
                                    f"({', '.join(s.cfg.data for s in self.subtasks)})")
        ds = MultiTaskDataset(parts, self.mt_task_names, self.dictionary.pad(), split)
        logger.info(f"glue_multitask {split}: " + ", ".join(
            f"{n} {int(k)}" for n, k in zip(self.mt_task_names, ds.lengths)))
        self.datasets[split] = ds
        return ds

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models

        with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack():
            cfg.max_positions = self.cfg.max_positions
        model = models.build_model(cfg, self, from_checkpoint)
        if not hasattr(model, "register_classification_head"):
            raise MultiTaskError(f"--task glue_multitask needs a model with classification heads "
                                 f"(roberta_*, ca_mtl_roberta_*), not {type(model).__name__}")
        for name, k in zip(self.head_names, self.num_classes):
            model.register_classification_head(name, num_classes=k)
        self.freeze(model)
        return model

    def freeze(self, model):
        enc = model.encoder.sentence_encoder
        frozen = []
        if self.cfg.freeze_encoder_layers:
            for i in parse_layers(self.cfg.freeze_encoder_layers, len(enc.layers), "--freeze-encoder-layers",
                                  error=MultiTaskError):
                frozen.append(f"encoder.sentence_encoder.layers.{i}")
                enc.layers[i].requires_grad_(False)
        if self.cfg.freeze_embeddings:
            for attr in ("embed_tokens", "embed_positions", "layernorm_embedding", "emb_layer_norm"):
                mod = getattr(enc, attr, None)
                if isinstance(mod, torch.nn.Module):
                    frozen.append(f"encoder.sentence_encoder.{attr}")
                    mod.requires_grad_(False)
        if frozen:
            n = sum(p.numel() for p in model.parameters() if not p.requires_grad)
            logger.info(f"glue_multitask: frozen (not given to the optimizer) {', '.join(frozen)}: {n:,} elements")

    def build_criterion(self, cfg, from_checkpoint=False):
        from fairseq.criterions import CRITERION_REGISTRY

        name = getattr(cfg, "_name", None) or getattr(cfg, "criterion", None)
        if not getattr(CRITERION_REGISTRY.get(name), "handles_multitask", False):
            raise MultiTaskError(f"--task glue_multitask needs --criterion glue_multitask "
                                 f"(got {name}: it would use one head for every task)")
        return super().build_criterion(cfg, from_checkpoint)

    # ----------------------------------------------------------------- batches
    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1, num_shards=1,
                           shard_id=0, num_workers=0, epoch=1, data_buffer_size=0, disable_iterator_cache=False,
                           skip_remainder_batch=False, grouped_shuffling=False, update_epoch_batch_itr=False):
        if getattr(dataset, "split", None) != self.cfg.train_subset:  # dev sets: fairseq's batching
            return super().get_batch_iterator(
                dataset, max_tokens=max_tokens, max_sentences=max_sentences, max_positions=max_positions,
                ignore_invalid_inputs=ignore_invalid_inputs, required_batch_size_multiple=required_batch_size_multiple,
                seed=seed, num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
                data_buffer_size=data_buffer_size, disable_iterator_cache=disable_iterator_cache,
                skip_remainder_batch=skip_remainder_batch, grouped_shuffling=grouped_shuffling,
                update_epoch_batch_itr=update_epoch_batch_itr)
        if dataset in self.dataset_to_epoch_iter and not update_epoch_batch_itr and not disable_iterator_cache:
            return self.dataset_to_epoch_iter[dataset]
        if not max_sentences:
            raise MultiTaskError("--task glue_multitask samples batches of a fixed number of examples: "
                                 "give --batch-size")
        self.batch_size = int(max_sentences)
        kept = self._kept_indices(dataset, max_positions, ignore_invalid_inputs)
        mode, temperature = str(self.cfg.mt_sampling), float(self.cfg.mt_temperature)
        logger.info(f"glue_multitask: {mode} sampling, {sampling.steps_per_epoch([len(k) for k in kept], self.batch_size)}"
                    f" batches of {self.batch_size} per epoch over {num_shards} rank(s)")

        def make_batches(ds, ep):  # the same (seed, epoch) on every rank: each takes its own shard
            picks = sampling.epoch_batches(mode, [len(k) for k in kept], self.batch_size, seed, ep, temperature)
            return [kept_all[b] for b in picks]

        kept_all = np.concatenate(kept)
        dataset.set_epoch(epoch)
        itr = iterators.EpochBatchIterator(
            dataset=dataset, collate_fn=dataset.collater, batch_sampler=make_batches, seed=seed,
            num_shards=num_shards, shard_id=shard_id, num_workers=num_workers, epoch=epoch,
            buffer_size=data_buffer_size, disable_shuffling=True,  # the order is the sampler's
            skip_remainder_batch=skip_remainder_batch)
        if not disable_iterator_cache:  # as fairseq's: another caller's iterator (ChildTuning-D's) is not the trainer's
            self.dataset_to_epoch_iter[dataset] = itr
        return itr

    def _kept_indices(self, dataset, max_positions, ignore_invalid_inputs):
        """Per task, the global indices of the examples that fit the model."""
        kept = []
        for t in range(len(self.mt_task_names)):
            idx = np.arange(dataset.offsets[t], dataset.offsets[t] + dataset.lengths[t])
            if max_positions is not None and len(idx):
                limit = max_positions if isinstance(max_positions, (int, np.integer)) else min(
                    x for x in np.ravel(max_positions) if x is not None)
                ok = dataset.sizes[idx] <= limit
                if not ok.all():
                    if not ignore_invalid_inputs:
                        raise MultiTaskError(
                            f"{self.mt_task_names[t]}: {int((~ok).sum())} training examples are longer than "
                            f"{limit} tokens (first: example {int(idx[~ok][0] - dataset.offsets[t])}); "
                            "use --skip-invalid-size-inputs-valid-test to skip them")
                    logger.warning(f"{self.mt_task_names[t]}: skipping {int((~ok).sum())} examples longer than {limit}")
                    idx = idx[ok]
            if len(idx) == 0:
                raise MultiTaskError(f"{self.mt_task_names[t]}: no training example")
            kept.append(idx)
        return kept

    # ----------------------------------------------------------------- steps
    def forward_features(self, model, sample):
        """Encoder features [B, T, C] of a (possibly mixed-task) sample."""
        net_input = dict(sample["net_input"])
        if getattr(model, "is_task_conditioned", False):
            net_input["task_ids"] = sample["task_ids"]
        features, _ = model(**net_input, features_only=True)
        return features

    def head_logits(self, model, features, task_ids):
        """[(task id, positions in the batch, logits)] for every task present."""
        out = []
        for t in torch.unique(task_ids).tolist():
            pos = torch.nonzero(task_ids == t).flatten()
            out.append((t, pos, model.classification_heads[self.head_names[t]](features[pos])))
        return out

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if (str(self.cfg.mt_sampling) == "uncertainty" and sample and self.batch_size
                and len(sample["task_ids"]) > self.batch_size):
            sample = self.select_uncertain(model, sample)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def select_uncertain(self, model, sample):
        """MT-Uncertainty: score the candidates with one extra forward pass, keep the top --batch-size.

        Scored in eval mode (no dropout) without gradients; each rank selects from its own
        candidates (no communication).
        """
        was_training = model.training
        model.eval()
        with torch.no_grad():
            feats = self.forward_features(model, sample)
            entropy = torch.empty(len(sample["task_ids"]), device=feats.device)
            for t, pos, logits in self.head_logits(model, feats, sample["task_ids"]):
                entropy[pos] = sampling.normalized_entropy(logits).to(entropy)
        model.train(was_training)
        scores = sampling.uncertainty_scores(entropy, sample["task_ids"], len(self.mt_task_names))
        keep = sampling.select_uncertain(scores, self.batch_size)
        return subsample(sample, keep, self.dictionary.pad(), scored=len(sample["task_ids"]))

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def label_dictionary_of(self, t: int):
        return None if self.regression[t] else self.subtasks[t].label_dictionary


def subsample(sample, keep, pad_idx, scored=None):
    """The rows ``keep`` of a collated multi-task sample (padding trimmed to the longest kept row)."""
    keep = keep.to(sample["task_ids"].device)
    tokens = sample["net_input"]["src_tokens"].index_select(0, keep)
    lengths = sample["net_input"]["src_lengths"].index_select(0, keep)
    tokens = tokens[:, : int(lengths.max())] if len(lengths) else tokens
    out = dict(sample)
    out["net_input"] = {**sample["net_input"], "src_tokens": tokens, "src_lengths": lengths}
    for k in ("id", "target", "task_ids", "task_index"):
        out[k] = sample[k].index_select(0, keep)
    out["nsentences"] = len(keep)
    out["ntokens"] = int(lengths.sum())
    if scored is not None:
        out["mt_scored"] = scored
    return out


# Keys the criterion logs beside the per-head ones ("<head>_loss", ...): a head name must not produce them.
RESERVED_HEADS = {"target": "target_loss"}


def parse_task_names(spec: str, data: str) -> List[str]:
    """``--mt-tasks`` -> task names: GLUE tasks in GLUE's spelling (any case), other names as given
    (case-sensitive) when ``<data>/<NAME>-bin/labels.json`` makes them a user's own task."""
    names = [s.strip() for s in str(spec or "").split(",") if s.strip()]
    if not names:
        raise MultiTaskError(f"--mt-tasks is empty: name the tasks to train on, e.g. --mt-tasks CoLA,SST-2,STS-B "
                             f"(GLUE: {','.join(glue_tasks.TASKS)}; or a <NAME>-bin directory with labels.json)")
    out, heads = [], {}
    for n in names:
        try:
            name = glue_tasks.canonical(n)
        except glue_tasks.UnknownTask:
            name, task_dir = n, os.path.join(data, f"{n}-bin")
            labels = os.path.join(task_dir, "labels.json")
            if not os.path.isfile(labels):
                raise MultiTaskError(f"--mt-tasks {n}: not a GLUE task ({', '.join(glue_tasks.TASKS)}) and "
                                     f"{labels if os.path.isdir(task_dir) else task_dir} does not exist: name a GLUE "
                                     f"task or a <NAME>-bin directory with labels.json") from None
            if head_name(n) in glue_tasks.HEAD_TO_TASK:  # the criterion reads a GLUE head's metrics as GLUE's
                raise MultiTaskError(f"--mt-tasks {n}: its head name {head_name(n)} is GLUE task "
                                     f"{glue_tasks.HEAD_TO_TASK[head_name(n)]}'s; rename the task and its directory")
            if head_name(n) in RESERVED_HEADS:
                raise MultiTaskError(f"--mt-tasks {n}: head name {head_name(n)} would log as the criterion's own "
                                     f"{RESERVED_HEADS[head_name(n)]}; rename the task and its directory")
        if name in out:
            raise MultiTaskError(f"--mt-tasks: {name} given twice")
        if head_name(name) in heads:
            raise MultiTaskError(f"--mt-tasks: {heads[head_name(name)]} and {name} map to one head name "
                                 f"{head_name(name)} (lower case, other characters than a-z0-9 as _); rename one")
        heads[head_name(name)] = name
        out.append(name)
    return out


def check_same_dictionary(dirs: List[str]):
    """Every input of every task must use one dictionary: one model embeds them all."""
    ref = os.path.join(dirs[0], "input0", "dict.txt")
    with open(ref, "rb") as f:
        want = f.read()
    for d in dirs:
        for sub in ("input0", "input1"):
            path = os.path.join(d, sub, "dict.txt")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    if f.read() != want:
                        raise MultiTaskError(f"{path} differs from {ref}: the task directories were built with "
                                             "different dictionaries (run data-prep/prepare_glue.py with one --bpe-dir)")


def read_labels_json(name: str, task_dir: str) -> dict:
    """``<TASK>-bin/labels.json``: ``{"task": NAME, "num_classes": K}`` (K >= 2) or ``{"task": NAME,
    "regression": true}``, as data-prep/prepare_glue.py writes it (which adds id2label and notes)."""
    path = os.path.join(task_dir, "labels.json")
    if not os.path.isfile(path):
        raise MultiTaskError(f"{path}: missing (written by data-prep/prepare_glue.py; it says the task's classes)")
    with open(path, encoding="utf-8") as f:
        try:
            meta = json.load(f)
        except ValueError as e:
            raise MultiTaskError(f"{path}: not valid JSON ({e})") from None
    want = f'{{"task": "{name}", "num_classes": K}} or {{"task": "{name}", "regression": true}}'
    if not isinstance(meta, dict):
        raise MultiTaskError(f"{path}: expected an object {want}")
    if meta.get("task", name) != name:
        raise MultiTaskError(f"{path}: describes task {meta.get('task')!r}, expected {name!r}")
    regression = meta.get("regression", name == "STS-B")
    k = meta.get("num_classes")
    if not isinstance(regression, bool):
        raise MultiTaskError(f"{path}: regression must be true or false, got {regression!r}")
    if regression and k not in (None, 1):
        raise MultiTaskError(f"{path}: a regression has one output, but num_classes is {k!r}")
    if not regression and (not isinstance(k, int) or isinstance(k, bool) or k < 2):
        raise MultiTaskError(f"{path}: num_classes {k!r}: a classification task needs an integer >= 2 "
                             f"(expected {want})")
    meta["name"] = name
    meta["regression"] = regression
    meta["num_classes"] = 1 if regression else k
    return meta
