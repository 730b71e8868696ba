"""The session's fixtures and hooks; everything else the tests share is in tests/helpers/."""

import os
import signal

import pytest
import torch

import recadam_fairseq
from helpers import Tiny
from recadam_fairseq.tiny import make_tiny_roberta

# One thread per process: the suite runs as 2 xdist workers on CI's 2 cores, each starting fairseq-train
# processes; more threads would only oversubscribe the cores. Launches inherit it (helpers.launch, the scripts).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# A suite started in the background (`make test &` in a script) inherits SIGINT ignored, and so would the launchers
# the tests send a real Ctrl-C to (grid.sh, tune.sh): Python's handler here gives their SIGINT back its default
# (exec resets a caught signal to it).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# In-process tests use fairseq's registries; a test module may have imported the core (no fairseq)
# first, after which --user-dir skips the package: register explicitly, as a notebook user would.
recadam_fairseq.register()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny pretrained RoBERTa and its data (classification, masked-LM, three GLUE-like tasks), made once."""
    root = tmp_path_factory.mktemp("tiny")
    make_tiny_roberta.main([str(root)])
    return Tiny(root)


@pytest.fixture(scope="session")
def hf(tmp_path_factory):
    """Tiny Hugging Face encoders of every layout the converter takes (BERT, RoBERTa, XLM-R, DistilBERT, CamemBERT,
    ...) with their heads and tokenizers, and data of their words, made once (tests/helpers/hf_models.py):
    {name: directory}."""
    from helpers import hf_models

    return hf_models.make(str(tmp_path_factory.mktemp("hf")))


@pytest.fixture
def cpu_flat_fp16(monkeypatch):
    """fairseq's flat fp16 path in-process on the CPU (tests/train_entry.py says why), a CUDA machine too."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
