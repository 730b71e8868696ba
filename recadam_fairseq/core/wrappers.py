"""The model inside fairseq's and DDP's wrappers (they keep it in ``.module``)."""

import torch


def unwrap_model(module: torch.nn.Module) -> torch.nn.Module:
    while isinstance(getattr(module, "module", None), torch.nn.Module):
        module = module.module
    return module
