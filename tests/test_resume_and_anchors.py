"""Resuming is exact, the anchor survives in the optimizer state, random init, and bad restarts."""

import glob
import os
import subprocess
import sys

import pytest
import torch

from helpers import RECADAM, ROOT, TRAIN_ENTRY, assert_same_run, load_ckpt

FLAGS = RECADAM


@pytest.fixture(scope="module")
def straight(tiny, tmp_path_factory):
    """12 updates without interruption, starting from --restore-file PRETRAINED --reset-*."""
    save = tmp_path_factory.mktemp("straight")
    tiny.train(save, *FLAGS)
    return load_ckpt(save / "checkpoint_last.pt")


def test_resume_from_checkpoint_last_is_bit_exact(tiny, tmp_path, straight):
    save = tmp_path / "resumed"
    tiny.train(save, *FLAGS, updates=5)
    first = load_ckpt(save / "checkpoint_last.pt")
    assert {st.get("step") for st in first["last_optimizer_state"]["state"].values()} <= {5, None}
    # relaunch: fairseq loads checkpoint_last.pt with its optimizer state (no --reset-*)
    rc, log = tiny.train(save, *FLAGS, "--restore-file", str(save / "checkpoint_last.pt"), restore=False)
    assert "θ* restored from the checkpoint's optimizer state" in log
    resumed = load_ckpt(save / "checkpoint_last.pt")
    assert {st.get("step") for st in resumed["last_optimizer_state"]["state"].values()} <= {12, None}
    assert_same_run(straight, resumed)


def test_relaunching_a_finetune_from_model_command_is_bit_exact(tiny, tmp_path, straight):
    """--finetune-from-model is used on the first launch only; the same command then resumes."""
    save = tmp_path / "ft"
    cmd = [*FLAGS, "--finetune-from-model", tiny.pretrained]
    tiny.train(save, *cmd, "--max-update", "5", restore=False)
    rc, log = tiny.train(save, *cmd, restore=False)
    assert "θ* restored from the checkpoint's optimizer state" in log
    assert_same_run(straight, load_ckpt(save / "checkpoint_last.pt"))


def test_reset_optimizer_on_a_finetuned_checkpoint(tiny, tmp_path, straight):
    ft = tmp_path / "ft.pt"
    torch.save(straight, ft)
    rc, log = tiny.train(tmp_path / "again", *FLAGS, "--restore-file", str(ft), "--reset-optimizer",
                         "--reset-dataloader", "--reset-meters", updates=2, restore=False)
    assert "was written by recadam after 12 updates" in log and "FINE-TUNED weights" in log
    assert "--recadam-pretrained-path" in log
    # ... and with --recadam-pretrained-path the anchor is the pretrained model again, silently
    rc, log = tiny.train(tmp_path / "again2", *FLAGS, "--restore-file", str(ft), "--reset-optimizer",
                         "--reset-dataloader", "--reset-meters", "--recadam-pretrained-path", tiny.pretrained,
                         updates=2, restore=False)
    assert "FINE-TUNED" not in log
    pre = load_ckpt(tiny.pretrained)["model"]
    anchors = [st["anchor"] for st in load_ckpt(tmp_path / "again2" / "checkpoint_last.pt")["last_optimizer_state"]["state"].values() if "anchor" in st]
    emb = pre["encoder.sentence_encoder.embed_tokens.weight"]
    assert any(a.shape == emb.shape and torch.equal(a, emb) for a in anchors)


def test_random_init_recalls_the_pretrained_weights(tiny, tmp_path):
    """The authors' preferred setting: random init, θ* only through --recadam-pretrained-path."""
    save = tmp_path / "rand"
    tiny.train(save, "--recadam-pretrained-path", tiny.pretrained, "--recadam-anneal-k", "0.5",
               "--recadam-anneal-t0", "20", "--recadam-pretrain-cof", "500",
               "--save-interval-updates", "1", "--keep-interval-updates", "-1", updates=6, restore=False)
    pre = load_ckpt(tiny.pretrained)["model"]

    def dist(n):
        st = load_ckpt(save / f"checkpoint_1_{n}.pt")["model"]
        return sum(((st[k].double() - pre[k].double()) ** 2).sum().item() for k in pre if k in st
                   and not k.startswith("classification_heads."))

    d = [dist(n) for n in range(1, 7)]
    assert d[0] > 10  # random weights are far from the pretrained ones
    assert all(b < a for a, b in zip(d, d[1:]))  # the pull recalls them, update after update
    assert d[-1] < 0.25 * d[0]  # lr·(1−λ)·γ ≈ 0.5 per update, against the task's own Adam steps


def test_recadam_checkpoint_loads_in_plain_fairseq(tiny, tmp_path, straight):
    """No user-dir: fairseq's own loaders read a recadam checkpoint (torch's weights-only check is
    about fairseq's argparse.Namespace, handled by the documented environment variable)."""
    d = tmp_path / "plain"
    d.mkdir()
    torch.save(straight, d / "model.pt")
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    code = (
        "import sys; from fairseq.models.roberta import RobertaModel\n"
        f"m = RobertaModel.from_pretrained({str(d)!r}, 'model.pt', data_name_or_path={tiny.cls_bin!r}, bpe='characters')\n"
        "assert 'recadam_fairseq' not in sys.modules\n"
        "print('classes', m.model.classification_heads['sentence_classification_head'].out_proj.out_features)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "classes 2" in out.stdout
    # fairseq-validate (the run used fairseq's own criterion; one trained with
    # sentence_prediction_recadam needs --user-dir to rebuild that criterion)
    out = subprocess.run([sys.executable, "-m", "fairseq_cli.validate", tiny.cls_bin, "--path", str(d / "model.pt"),
                          "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--cpu",
                          "--batch-size", "16", "--num-workers", "0"],
                         env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "valid on 'valid' subset" in out.stdout + out.stderr
    # fine-tune it further with fairseq's own adam, without the user-dir
    cmd = [sys.executable, TRAIN_ENTRY, *[a for a in tiny.finetune_args(tmp_path / "adam", optimizer="adam", updates=2,
                                                                          restore=False)
                                          if a not in ("--user-dir",)]]
    cmd = [a for a in cmd if a != os.path.join(ROOT, "recadam_fairseq")]
    cmd += ["--restore-file", str(d / "model.pt"), "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert glob.glob(str(tmp_path / "adam" / "checkpoint_last.pt"))


def test_optimizer_state_of_another_layout_or_optimizer_needs_reset(tiny, tmp_path):
    save = tmp_path / "fp32"
    tiny.train(save, *FLAGS, updates=2)
    last = str(save / "checkpoint_last.pt")
    before = open(last, "rb").read()
    # same model, state saved per tensor (fp32), resumed with --fp16 (one flat tensor)
    rc, log = tiny.train(tmp_path / "fp16", *FLAGS, "--fp16", "--restore-file", last, check=False, restore=False)
    assert rc != 0 and "--reset-optimizer" in log
    # state written by another optimizer: fairseq's own check
    rc, log = tiny.train(tmp_path / "adam", "--restore-file", last, optimizer="adam", check=False, restore=False)
    assert rc != 0 and "Optimizer does not match; please reset the optimizer (--reset-optimizer)" in log
    assert open(last, "rb").read() == before  # nothing saved was touched
