"""WiSE-FT weight-space interpolation: core/wise_ft.py against float64 references, and
scripts/interpolate.py end to end on a checkpoint of the real fairseq-train (loaded back by fairseq)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, SCRIPTS, code_carrying, load_ckpt
from recadam_fairseq.core.errors import ConfigError
from recadam_fairseq.core.wise_ft import interpolate, shared_names
from recadam_fairseq.use import interpolate as wise

SCRIPT = os.path.join(SCRIPTS, "interpolate.py")


def _states(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    emb_ft, emb_pre = r(11, 4), r(11, 4)
    ft = {"enc.emb.weight": emb_ft, "enc.layer.weight": r(4, 4), "enc.layer.bias": r(4),
          "lm_head.weight": emb_ft,  # tied to the embeddings, as RoBERTa's LM head
          "head.out_proj.weight": r(2, 4),  # new: not in θ*
          "enc.resized.weight": r(3, 4),  # θ* has it with another shape
          "enc.version": torch.tensor([3], dtype=torch.int64)}  # not floating
    pre = {"enc.emb.weight": emb_pre, "enc.layer.weight": r(4, 4), "enc.layer.bias": r(4), "lm_head.weight": emb_pre,
           "enc.resized.weight": r(5, 4), "enc.version": torch.tensor([1], dtype=torch.int64),
           "pretraining_only.weight": r(2)}
    return ft, pre


SHARED = ["enc.emb.weight", "enc.layer.weight", "enc.layer.bias", "lm_head.weight"]


def test_interpolate_float64():
    ft, pre = _states()
    assert shared_names(ft, pre) == SHARED
    ends = {0.0: pre, 1.0: ft}
    for alpha in (0.0, 0.3, 0.5, 1.0, 1):
        out = interpolate(ft, pre, alpha)
        assert list(out) == list(ft)  # same names, same order
        for k in ("head.out_proj.weight", "enc.resized.weight", "enc.version"):
            assert out[k] is ft[k], k  # carried from θ_ft
        for k in SHARED:
            assert out[k].dtype == torch.float64 and out[k].shape == ft[k].shape
            if alpha in ends:
                assert torch.equal(out[k], ends[alpha][k]), (alpha, k)  # bit for bit
            else:  # the weighted mean, written out in float64
                want = (1 - alpha) * pre[k] + alpha * ft[k]
                torch.testing.assert_close(out[k], want, rtol=0, atol=1e-15)
        assert out["lm_head.weight"] is out["enc.emb.weight"]  # still tied
        if alpha == 0.5:
            for k in SHARED:
                torch.testing.assert_close(out[k], (ft[k] + pre[k]) / 2, rtol=0, atol=1e-15)
    # the inputs are untouched
    again, _ = _states()
    assert all(torch.equal(ft[k], again[k]) for k in ft)


def test_interpolate_half_precision():
    """fp16 / bf16 are mixed in fp32 and rounded once; the ends stay exact; the dtype stays θ_ft's."""
    for dtype in (torch.float16, torch.bfloat16):
        ft, pre = _states(dtype)
        pre = {k: v.float() if v.is_floating_point() else v for k, v in pre.items()}  # θ* saved in fp32
        for alpha in (0.0, 0.25, 1.0):
            out = interpolate(ft, pre, alpha)
            for k in SHARED:
                assert out[k].dtype == dtype
                want = ((1 - alpha) * pre[k].double() + alpha * ft[k].double()).to(dtype)
                if alpha in (0.0, 1.0):
                    assert torch.equal(out[k], want), (dtype, alpha, k)
                else:  # one rounding of an fp32 value: at most one step of the format apart
                    torch.testing.assert_close(out[k].double(), want.double(), rtol=2 * torch.finfo(dtype).eps,
                                               atol=0)


def test_interpolate_bad_input():
    ft, pre = _states()
    for alpha, message in ((-0.1, "--alpha -0.1: must be in [0, 1]"), (1.5, "--alpha 1.5: must be in [0, 1]"),
                           (float("nan"), "--alpha nan: must be in [0, 1]"), ("x", "--alpha 'x': not a number")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            interpolate(ft, pre, alpha)
    with pytest.raises(ConfigError, match="share no tensor"):
        interpolate(ft, {"other.weight": torch.zeros(4, 4, dtype=torch.float64)}, 0.5)


def test_roberta_names_of_a_released_checkpoint():
    """θ* with fairseq's old RoBERTa names (decoder.*, emb_layer_norm) is read under the new ones; a
    sequence-to-sequence pair keeps its decoder.* names."""
    pre = {"decoder.sentence_encoder.emb_layer_norm.weight": torch.ones(2), "decoder.lm_head.bias": torch.ones(3)}
    ft = {"encoder.sentence_encoder.layernorm_embedding.weight": torch.zeros(2), "encoder.lm_head.bias": torch.zeros(3)}
    assert sorted(wise.roberta_names(pre, ft)) == sorted(ft)
    seq2seq = {"encoder.layers.0.fc1.weight": torch.zeros(2), "decoder.layers.0.fc1.weight": torch.zeros(2)}
    assert wise.roberta_names(seq2seq, seq2seq) == seq2seq
    assert wise.roberta_names(pre, {"decoder.x": torch.zeros(1)}) == pre


def _run(*argv):
    return subprocess.run([sys.executable, SCRIPT, *map(str, argv)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def finetuned(tiny, tmp_path_factory):
    """A real fine-tuned checkpoint of the tiny RoBERTa: 2 adam updates of sentence_prediction."""
    save = tmp_path_factory.mktemp("wise-ft")
    tiny.train(save, optimizer="adam", updates=2)
    return str(save / "checkpoint_last.pt")


def test_script_writes_checkpoints_fairseq_loads(tiny, finetuned, tmp_path):
    from fairseq import checkpoint_utils

    out = tmp_path / "wise" / "ft.pt"
    proc = _run(finetuned, "--pretrained", tiny.pretrained, "--alpha", "0", "0.5", "--alpha", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    ft_state, pre = load_ckpt(finetuned), load_ckpt(tiny.pretrained)["model"]
    ft = ft_state["model"]
    shared = [k for k in ft if k in pre and pre[k].shape == ft[k].shape]
    heads = [k for k in ft if k.startswith("classification_heads.")]
    assert len(shared) > 20 and heads and not set(heads) & set(pre)
    assert "last_optimizer_state" in ft_state
    for alpha in (0, 0.5, 1):
        path = tmp_path / "wise" / f"ft_alpha{alpha:g}.pt"
        assert f"{path}: α = {alpha:g}, {len(shared)} of {len(ft)} model tensors interpolated" in proc.stdout
        state = load_ckpt(path)
        assert "last_optimizer_state" not in state
        assert state["optimizer_history"] == ft_state["optimizer_history"] and state["cfg"] == ft_state["cfg"]
        assert state["wise_ft"]["alpha"] == alpha and state["wise_ft"]["interpolated_tensors"] == len(shared)
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)],
                                                                        arg_overrides={"data": tiny.cls_bin})
        loaded = models[0].state_dict()
        assert sorted(loaded) == sorted(ft)
        for k in shared:
            want = (1 - alpha) * pre[k].double() + alpha * ft[k].double()
            if alpha in (0, 1):
                assert torch.equal(loaded[k], want.float()), (alpha, k)
            else:
                torch.testing.assert_close(loaded[k].double(), want, rtol=1e-6, atol=1e-7)
        for k in heads:
            assert torch.equal(loaded[k], ft[k]), k
        if alpha == 0.5:
            assert not torch.equal(loaded["encoder.sentence_encoder.layers.0.fc1.weight"],
                                   ft["encoder.sentence_encoder.layers.0.fc1.weight"])

    # fairseq-validate reads it as it reads θ_ft
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-validate"), tiny.cls_bin,
                           "--user-dir", os.path.join(ROOT, "recadam_fairseq"), "--path",
                           str(tmp_path / "wise" / "ft_alpha0.5.pt"), "--task", "sentence_prediction",
                           "--criterion", "sentence_prediction", "--valid-subset", "valid", "--batch-size", "32",
                           "--cpu"], capture_output=True, text=True, cwd=tiny.root)
    assert proc.returncode == 0 and "valid on 'valid' subset" in proc.stdout + proc.stderr, proc.stderr[-2000:]

    # θ* under fairseq's old RoBERTa names gives the same file contents
    legacy = {("decoder" + k[len("encoder"):] if k.startswith("encoder") else k).replace(
        ".layernorm_embedding.", ".emb_layer_norm."): v for k, v in pre.items()}
    assert any(".emb_layer_norm." in k for k in legacy)
    torch.save({"model": legacy}, tmp_path / "legacy.pt")
    assert _run(finetuned, "--pretrained", tmp_path / "legacy.pt", "--alpha", "0.5",
                "--out", tmp_path / "legacy-wise.pt").returncode == 0
    a, b = load_ckpt(tmp_path / "legacy-wise.pt")["model"], load_ckpt(tmp_path / "wise" / "ft_alpha0.5.pt")["model"]
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_script_bad_input_is_one_line(tiny, finetuned, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "plain.pt")
    torch.save({"model": {"other.weight": torch.zeros(3)}}, tmp_path / "other.pt")
    torch.save({"model": load_ckpt(tiny.pretrained)["model"]}, tmp_path / "no-cfg.pt")
    refusal = code_carrying(tmp_path / "code.pt", tmp_path / "payload-ran")
    out = str(tmp_path / "out.pt")
    cases = [
        ([str(tmp_path / "missing.pt"), "--pretrained", tiny.pretrained], f"{tmp_path / 'missing.pt'}: no such file"),
        ([finetuned, "--pretrained", str(tmp_path / "missing.pt")], f"--pretrained {tmp_path / 'missing.pt'}: no such"),
        ([str(tmp_path / "notes.txt"), "--pretrained", tiny.pretrained], "notes.txt: not a torch checkpoint"),
        ([str(tmp_path / "code.pt"), "--pretrained", tiny.pretrained], f"code.pt: {refusal}"),
        ([finetuned, "--pretrained", str(tmp_path / "code.pt")], f"--pretrained {tmp_path / 'code.pt'}: {refusal}"),
        ([str(tmp_path / "plain.pt"), "--pretrained", tiny.pretrained], "plain.pt: not a fairseq checkpoint"),
        ([str(tmp_path / "no-cfg.pt"), "--pretrained", tiny.pretrained], "no-cfg.pt: not a fairseq training"),
        ([finetuned, "--pretrained", str(tmp_path / "other.pt")], "share no model tensor"),
        ([finetuned, "--pretrained", tiny.pretrained, "--alpha", "1.5"], "--alpha 1.5: must be in [0, 1]"),
        ([finetuned, "--pretrained", tiny.pretrained, "--alpha", "half"], "--alpha 'half': not a number"),
        ([finetuned, "--pretrained", tiny.pretrained, "--alpha", "0.5", "--out", finetuned], "is an input checkpoint"),
        ([finetuned, "--alpha", "0.5"], "the following arguments are required: --pretrained"),
    ]
    for argv, message in cases:
        if "--alpha" not in argv:
            argv = argv + ["--alpha", "0.5"]
        if "--out" not in argv:
            argv = argv + ["--out", out]
        if "required" in message:  # argparse's own check, one line too
            with pytest.raises(SystemExit) as e:
                wise.main(argv)
            assert e.value.code == 1
        else:
            assert wise.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("interpolate.py: error: ") and message in err, (argv, err)
    assert not os.path.exists(out) and not (tmp_path / "payload-ran").exists()
    proc = _run(finetuned, "--pretrained", tiny.pretrained, "--alpha", "-1", "--out", out)  # the real entry point
    assert proc.returncode == 1 and proc.stderr == "interpolate.py: error: --alpha -1: must be in [0, 1] " \
        "(0: the pretrained weights, 1: the fine-tuned ones)\n", proc.stderr

