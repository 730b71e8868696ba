"""How the package loads: the core without fairseq, the components under --user-dir, the --user-dir path."""

import os
import subprocess
import sys

import torch

from helpers import ROOT, USER_DIR, load_ckpt


def _python(code, env=None, **kw):
    env = env if env is not None else os.environ
    env = {**env, "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, **kw)


def test_core_import_leaves_fairseq_and_logging_alone():
    code = ("import logging, sys\n"
            "before = (logging.getLogger().level, list(logging.getLogger().handlers))\n"
            "import recadam_fairseq\n"
            "from recadam_fairseq import RecAdam, anneal_lambda\n"
            "import recadam_fairseq.core.sam  # the SAM family's core is pure torch too\n"
            "assert 'fairseq' not in sys.modules, sorted(m for m in sys.modules if m.startswith('fairseq'))\n"
            "assert (logging.getLogger().level, list(logging.getLogger().handlers)) == before\n"
            "print('ok')\n")
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "tensorboardX" not in out.stdout + out.stderr


def test_user_dir_registers_every_component():
    code = ("from fairseq import utils\n"
            "from argparse import Namespace\n"
            f"utils.import_user_module(Namespace(user_dir={USER_DIR!r}))\n"
            "from fairseq.optim import OPTIMIZER_REGISTRY\n"
            "from fairseq.criterions import CRITERION_REGISTRY\n"
            "import torch\n"
            "assert 'recadam' in OPTIMIZER_REGISTRY and 'samsgd' in OPTIMIZER_REGISTRY\n"
            "assert 'sentence_prediction_recadam' in CRITERION_REGISTRY\n"
            "from fairseq import checkpoint_utils\n"  # the allow-list came with it
            "import argparse\n"
            "assert argparse.Namespace in torch.serialization.get_safe_globals()\n"
            "print('ok')\n")
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_explicit_register_after_a_core_import():
    code = ("import recadam_fairseq\n"
            "import fairseq\n"
            "from fairseq.optim import OPTIMIZER_REGISTRY\n"
            "assert 'recadam' not in OPTIMIZER_REGISTRY\n"
            "recadam_fairseq.register(); recadam_fairseq.register()\n"
            "assert 'recadam' in OPTIMIZER_REGISTRY and 'samsgd' in OPTIMIZER_REGISTRY\n"
            "print('ok')\n")
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_module_prints_the_user_dir():
    out = subprocess.run([sys.executable, "-m", "recadam_fairseq", "--user-dir"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert os.path.samefile(out.stdout.strip(), USER_DIR)


def test_from_pretrained_with_user_dir_loads_a_recadam_checkpoint(tiny, tmp_path):
    """fairseq's hub loader imports the user-dir itself (user_dir=...), which registers the components and
    the checkpoint allow-list: no TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD needed for a recadam checkpoint."""
    save = tmp_path / "run"
    tiny.train(save, "--criterion", "sentence_prediction_recadam", updates=2)
    head = load_ckpt(save / "checkpoint_last.pt")["model"]["classification_heads.sentence_classification_head.out_proj.weight"]
    code = ("import sys, torch\n"
            "from fairseq.models.roberta import RobertaModel\n"
            f"m = RobertaModel.from_pretrained({str(save)!r}, 'checkpoint_last.pt', data_name_or_path={tiny.cls_bin!r},"
            f" bpe='characters', user_dir={USER_DIR!r})\n"
            "from fairseq.optim import OPTIMIZER_REGISTRY\n"
            "assert 'recadam_fairseq' in sys.modules and 'recadam' in OPTIMIZER_REGISTRY\n"
            "w = m.model.classification_heads['sentence_classification_head'].out_proj.weight\n"
            f"torch.save(w.detach(), {str(tmp_path / 'head.pt')!r})\n"
            "print('ok', tuple(m.predict('sentence_classification_head', m.encode('w1 w2 good3')).shape))\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    out = _python(code, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok (1, 2)"
    assert torch.equal(torch.load(tmp_path / "head.pt"), head)
