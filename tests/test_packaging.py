"""How the package loads: the core without fairseq, the components under --user-dir, the --user-dir path."""

import os
import subprocess
import sys

from conftest import ROOT, USER_DIR


def _python(code, **kw):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, **kw)


def test_core_import_leaves_fairseq_and_logging_alone():
    code = ("import logging, sys\n"
            "before = (logging.getLogger().level, list(logging.getLogger().handlers))\n"
            "import recadam_fairseq\n"
            "from recadam_fairseq import RecAdam, anneal_lambda\n"
            "import recadam_fairseq.sam  # the SAM family's core is pure torch too\n"
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
