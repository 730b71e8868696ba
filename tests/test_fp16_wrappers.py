"""recadam inside fairseq's fp16 wrappers, in-process, against the core on the same gradients.

FP16Optimizer (flat or per-parameter fp32 master copies) and MemoryEfficientFP16Optimizer
(fp16 params, fp32 math) must apply exactly the per-parameter rule of the core: the encoder is
anchored, the new head gets plain Adam, on the right element ranges of the flat tensor.
"""

import pytest
import torch
from fairseq import optim

from helpers import FP16_FLAGS as FLAGS, FP16_HALF as HALF, FP16_HP as HP, FP16_STEPS as STEPS
from helpers import Net, flat_params, fp16_grads as grads, parse, run_wrapper
from recadam_fairseq import RecAdam


def run_core(rounded_each_step=False, anchor_dtype=torch.float32, half=torch.float16):
    """The core on fp32 copies of the half weights, fed the same (half-rounded) gradients."""
    torch.manual_seed(0)
    pre = Net(head=False)
    torch.manual_seed(1)
    net = Net()
    net.load_state_dict(pre.state_dict(), strict=False)
    net = net.to(half).float()
    enc, head = list(net.encoder.parameters()), list(net.head.parameters())
    opt = RecAdam([dict(params=enc, pretrain_params=[p.detach().to(anchor_dtype).float().clone() for p in enc]),
                   dict(params=head, anneal_w=0.0)], **HP)
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        for p, g in zip(net.parameters(), grads(gen, net)):
            p.grad = g.to(half).float()
        opt.step()
        if rounded_each_step:  # no fp32 master copy: the half value is the state
            for p in net.parameters():
                p.data.copy_(p.data.to(half).float())
    return net


@pytest.mark.parametrize("mode", ["fp16-flat", "fp16-per-param"])
def test_fp16_master_weights_equal_the_core(mode, tmp_path, cpu_flat_fp16):
    net, opt = run_wrapper(mode, tmp_path)
    master = opt.fp32_params
    master = torch.cat([p.reshape(-1) for p in (master.values() if isinstance(master, dict) else master)])
    want = flat_params(run_core())
    assert torch.equal(master, want)  # the same fp32 arithmetic, element for element
    assert torch.equal(flat_params(net), want.half().float())  # the fp16 model is the rounded master
    core = opt.optimizer
    if mode == "fp16-flat":
        (flat,) = [p for g in core.param_groups for p in g["params"]]
        n_enc = sum(p.numel() for p in net.encoder.parameters())
        assert core.state[flat]["anchor_runs"] == [[0, n_enc]]  # the head's range is not anchored
        assert core.state[flat]["anchor"].numel() == n_enc


@pytest.mark.parametrize("mode", ["memory-efficient-fp16", "memory-efficient-bf16"])
def test_memory_efficient_modes_equal_the_core_rounded_each_step(mode, tmp_path):
    net, opt = run_wrapper(mode, tmp_path)
    want = flat_params(run_core(rounded_each_step=True, half=HALF[mode]))
    assert torch.equal(flat_params(net), want)
    st = opt.optimizer.state[net.encoder.weight]
    assert st["exp_avg"].dtype == torch.float32 and st["anchor"].dtype == torch.float32
    assert net.encoder.weight.dtype == HALF[mode]


def test_bf16_master_weights_equal_the_core(tmp_path):
    """--bf16: fp32 master copies per tensor (never flat), no loss scale; the bf16 model is their rounding."""
    net, opt = run_wrapper("bf16", tmp_path)
    assert isinstance(opt.fp32_params, list) and opt.scaler is None
    want = flat_params(run_core(half=torch.bfloat16))
    assert torch.equal(torch.cat([p.reshape(-1) for p in opt.fp32_params]), want)
    assert torch.equal(flat_params(net), want.bfloat16().float())
    assert "anchor" not in opt.optimizer.state[opt.fp32_params[-1]]  # the new head


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precision_anchor(dtype, torch_dtype, tmp_path, cpu_flat_fp16):
    """A half anchor stores p* rounded once; the update then equals the core with that p*."""
    net, opt = run_wrapper("fp16-flat", tmp_path, anchor_dtype=dtype)
    (flat,) = [p for g in opt.optimizer.param_groups for p in g["params"]]
    assert opt.optimizer.state[flat]["anchor"].dtype == torch_dtype
    assert torch.equal(opt.fp32_params[None].detach() if None in opt.fp32_params else next(iter(opt.fp32_params.values())).detach(),
                       flat_params(run_core(anchor_dtype=torch_dtype)))


def test_overflowing_step_changes_nothing(tmp_path, cpu_flat_fp16):
    """fairseq skips the step on loss-scale overflow: t, the moments and the anchor stay."""
    net, opt = run_wrapper("fp16-flat", tmp_path)
    core = opt.optimizer
    (flat,) = [p for g in core.param_groups for p in g["params"]]
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in core.state[flat].items()}
    master = flat.detach().clone()
    opt.zero_grad()
    for p in net.parameters():
        p.grad = torch.full_like(p, float("inf"))
    opt._needs_sync = True
    opt.all_reduce_grads(net)
    with pytest.raises(OverflowError):  # what fairseq's Trainer catches to skip the update
        opt.clip_grad_norm(0.0)
    after = core.state[flat]
    assert after["step"] == before["step"] == STEPS
    for k in ("exp_avg", "exp_avg_sq", "anchor"):
        assert torch.equal(after[k], before[k])
    assert torch.equal(flat.detach(), master)


def test_amp_steps_on_gradients_unscaled_once(tmp_path):
    """fairseq's --amp (AMPOptimizer; torch's CPU GradScaler in place of its CUDA one): the step is recadam's
    fp32 step on the true gradients, bit for bit, not on gradients / loss scale (fairseq unscales them in
    clip_grad_norm, and GradScaler.step would again); an overflow skips it and leaves t, the moments and θ*."""
    restore = tmp_path / "pre.pt"
    torch.manual_seed(0)
    torch.save({"model": Net(head=False).state_dict()}, restore)
    nets, opts = [], []
    for amp in (False, True):
        torch.manual_seed(1)
        net = Net()
        net.load_state_dict(torch.load(restore)["model"], strict=False)
        cfg = parse(*FLAGS, *(["--amp"] if amp else []), restore=restore)
        if amp:
            opt = optim.AMPOptimizer.build_optimizer(cfg, list(net.parameters()))
            opt._grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 7)
            opt.scaler.scale(torch.zeros(()))  # what opt.backward(loss) does first: the scale exists from here
        else:
            opt = optim.build_optimizer(cfg.optimizer, list(net.parameters()))
        nets.append(net)
        opts.append(opt)
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        g = grads(gen, nets[0])
        for (net, opt), s in zip(zip(nets, opts), (1.0, 2.0 ** 7)):
            for p, gp in zip(net.parameters(), g):
                p.grad = gp * s  # as scaler.scale(loss).backward() leaves them (a power of 2: exact)
            opt.all_reduce_grads(net)
            opt.clip_grad_norm(0.0)
            opt.step()
    for a, b in zip(*(n.parameters() for n in nets)):
        assert torch.equal(a, b)
    amp, core = opts[1], opts[1].optimizer
    before = {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in core.state[p].items()}
              for p in nets[1].parameters()}
    weights = [p.detach().clone() for p in nets[1].parameters()]
    for p in nets[1].parameters():
        p.grad = torch.full_like(p, float("inf"))
    amp.clip_grad_norm(0.0)
    amp.step()
    assert amp.scaler.get_scale() == 2.0 ** 6  # the scaler saw the overflow and backed off
    for p, w in zip(nets[1].parameters(), weights):
        assert torch.equal(p.detach(), w)
        for k, v in before[id(p)].items():
            assert torch.equal(torch.as_tensor(core.state[p][k]), torch.as_tensor(v)), k
    assert core.state[next(nets[1].parameters())]["step"] == STEPS
    with pytest.raises(RuntimeError, match="not unscaled"):  # GradScaler.step without the unscale before it
        amp.step()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp16-flat", "fp16-per-param"])
def test_fp16_wrappers_on_gpu_equal_the_core(mode, tmp_path):
    net, opt = run_wrapper(mode, tmp_path, device="cuda")
    master = opt.fp32_params
    master = torch.cat([p.reshape(-1) for p in (master.values() if isinstance(master, dict) else master)]).cpu()
    want = flat_params(run_core())
    # CUDA kernels may fuse multiply-adds differently from the CPU: fp32 round-off per step
    torch.testing.assert_close(master, want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_bf16_wrapper_on_gpu_equals_the_core(tmp_path):
    net, opt = run_wrapper("bf16", tmp_path, device="cuda")
    master = torch.cat([p.reshape(-1) for p in opt.fp32_params]).cpu()
    torch.testing.assert_close(master, flat_params(run_core(half=torch.bfloat16)), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["memory-efficient-fp16", "memory-efficient-bf16"])
def test_memory_efficient_modes_on_gpu(mode, tmp_path):
    net, opt = run_wrapper(mode, tmp_path, device="cuda")
    want = flat_params(run_core(rounded_each_step=True, half=HALF[mode]))
    # one ulp of the half type (2^-10 fp16, 2^-7 bf16, relative): a different fp32 round-off can round
    # the half result the other way, and the next step starts from there
    ulp = 2 ** -10 if HALF[mode] == torch.float16 else 2 ** -7
    torch.testing.assert_close(flat_params(net).cpu(), want, rtol=2 * ulp, atol=1e-4)
