"""Where RecAdam's θ* comes from in a fairseq run: the checkpoint fairseq loads the weights from (its
restore rule), or ``--recadam-pretrained-path``. Building θ* from it is ``core/anchor.py``.

Used by ``--optimizer recadam`` (``optim/fairseq_recadam.py``) and the coupled objective
(``criterions/coupled_term.py``).
"""

import logging
import os
from typing import Dict, Optional, Set

import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.optim import OPTIMIZER_DATACLASS_REGISTRY, OPTIMIZER_REGISTRY

from .config import RecAdamHyperparams
from ..core import anchor
from ..core.anchor import AnchorError
from ..core.wrappers import unwrap_model

logger = logging.getLogger(__name__)

# fairseq's models log under it, and so do this plug-in's (models/): the loggers of a model's upgrade
MODELS_LOGGER = "fairseq.models"


def restore_path(cfg) -> str:
    """The checkpoint fairseq loads the model weights from (its rule in checkpoint_utils)."""
    if cfg.restore_file == "checkpoint_last.pt":
        last = os.path.join(cfg.save_dir, "checkpoint_last.pt")
        if not os.path.exists(last) and cfg.finetune_from_model:
            return cfg.finetune_from_model
        return last
    return cfg.restore_file


def recadam_components() -> Set[str]:
    """The class names, as fairseq's checkpoints record them, of the registered optimizers and criteria
    that take the --recadam-* flags: the checkpoints they write hold weights pulled toward θ* and
    fine-tuned, which a new run could take for θ*."""
    return {cls.__name__ for classes, configs in ((OPTIMIZER_REGISTRY, OPTIMIZER_DATACLASS_REGISTRY),
                                                 (CRITERION_REGISTRY, CRITERION_DATACLASS_REGISTRY))
            for name, cls in classes.items()
            if isinstance(configs.get(name), type) and issubclass(configs[name], RecAdamHyperparams)}


def recadam_updates(state: dict) -> int:
    """How many updates a recadam run made to produce this checkpoint (0: a pretrained model)."""
    history = state.get("optimizer_history") or []
    if not history:
        return 0
    last, ours = history[-1], recadam_components()
    written = last.get("optimizer_name") in ours or last.get("criterion_name") in ours
    return int(last.get("num_updates", 0)) if written else 0


def anchor_source(cfg, preloaded: Optional[Dict[str, torch.Tensor]] = None, resuming_is_error: bool = False):
    """Where θ* comes from, for a config with the recadam_* and checkpoint fields.

    Returns (what to log, the checkpoint's model state dict, whether θ* takes the file's values
    rather than the weights fairseq loaded). Raises AnchorError when there is no pretrained model.
    """
    if cfg.recadam_pretrained_path:
        state = preloaded if preloaded is not None else pretrained_model_state(cfg.recadam_pretrained_path)
        return f"--recadam-pretrained-path {cfg.recadam_pretrained_path}", state, True
    path = restore_path(cfg)
    resuming = path == os.path.join(cfg.save_dir, "checkpoint_last.pt") and os.path.exists(path)
    if resuming and cfg.finetune_from_model and os.path.exists(cfg.finetune_from_model):
        # fairseq resumes from checkpoint_last.pt (fine-tuned); the pretrained file is still named
        f = cfg.finetune_from_model
        return f"--finetune-from-model {f}", _load(f, "--finetune-from-model")["model"], True
    if not os.path.exists(path):
        raise AnchorError(
            f"recadam has no pretrained weights to pull toward: no checkpoint was loaded ({path} does not "
            f"exist). Give the pretrained model with --restore-file (or --finetune-from-model), or "
            f"--recadam-pretrained-path"
        )
    ckpt = _load(path, "--restore-file")
    done = recadam_updates(ckpt)
    if done:
        msg = (f"{path} was written by recadam after {done} updates: θ* would be these FINE-TUNED weights, "
               f"not the pretrained ones. Pass --recadam-pretrained-path PRETRAINED.pt")
        if resuming_is_error:
            raise AnchorError(msg)
        logger.warning(f"recadam: !!! {msg} to keep pulling toward the pretrained model !!!")
    flag = "--finetune-from-model" if path == cfg.finetune_from_model else "--restore-file"
    return f"{flag} {path}", ckpt["model"], False


def pretrained_model_state(path: str) -> Dict[str, torch.Tensor]:
    """The model state dict of ``--recadam-pretrained-path``; errors name the flag."""
    return _load(path, "--recadam-pretrained-path")["model"]


def _load(path: str, flag: str) -> dict:
    try:
        return anchor.load_checkpoint(path)
    except AnchorError as e:
        raise AnchorError(f"{flag} {e}") from None


def quiet_upgrade(model: torch.nn.Module) -> Optional[anchor.Upgrade]:
    """The model's ``upgrade_state_dict_named`` for the anchor's copy of the checkpoint, or None.

    fairseq ran it when it loaded the file and logged what it renamed, dropped or filled in (RoBERTa's
    "Overwriting classification_heads...", roberta_ft's re-init / LoRA / mixout lines); the second run
    would log them again as if the file were loaded twice: the models' logger keeps to errors for it.
    """
    model = unwrap_model(model)
    if not hasattr(model, "upgrade_state_dict_named"):
        return None

    def upgrade(state: Dict[str, torch.Tensor]) -> None:
        log = logging.getLogger(MODELS_LOGGER)
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            model.upgrade_state_dict_named(state, "")
        finally:
            log.setLevel(level)

    return upgrade


def build_anchors(tensors, model: torch.nn.Module, cfg, preloaded=None, dtype: Optional[torch.dtype] = None,
                  resuming_is_error: bool = False, shared: Optional[Dict[str, torch.Tensor]] = None):
    """θ* for ``tensors`` from the source ``cfg`` names (``core.anchor.build_anchors``' returns)."""
    source, state, from_file = anchor_source(cfg, preloaded, resuming_is_error)
    return anchor.build_anchors(tensors, model, source, state, from_file, dtype=dtype, shared=shared,
                                upgrade=quiet_upgrade(model))
