"""Data-parallel fairseq launches on CPU: one fairseq-train process per rank, gloo, no spawn.

fairseq's own spawn and torchrun do not work on a CPU-only torch; pytorch_ddp passes GPU device
ids (GPU-only tests below). Dropout is off so that N ranks and one rank with --update-freq N see
exactly the same computation up to the order of the gradient reduction.
"""

import os
import subprocess

import pytest
import torch

from helpers import (DIST_FLAGS, TRAIN_ENTRY, anchors, dumps, fast_train, free_port, json_records, load_ckpt, relative_gap,
                     run_jobs)

# fp32 sums of the same gradients in another order, then 12 Adam steps (whose normalisation
# amplifies the last bits of tiny gradients): measured < 1e-6 here
ATOL = 1e-5


def launch(tiny, save, world, *flags, **kw):
    """N ranks (or one) of the shared distributed command: helpers.DIST_FLAGS, then ``flags``."""
    return tiny.ranks(save, world, *DIST_FLAGS, *flags, **kw)


def close(a, b, atol=ATOL):
    return all(torch.allclose(a[k].double(), b[k].double(), rtol=0, atol=atol) for k in a)


@pytest.fixture(scope="module")
def one_rank(tiny, tmp_path_factory):
    """The reference: one worker, --update-freq 2, batch 8."""
    save = tmp_path_factory.mktemp("one")
    (log,) = launch(tiny, save, 1, "--update-freq", "2")
    return save, log


@pytest.mark.parametrize("backend", ["legacy_ddp", "no_c10d"])
def test_two_ranks_equal_one_rank_with_update_freq_two(tiny, tmp_path, one_rank, backend):
    save = tmp_path / backend
    launch(tiny, save, 2, backend=backend)
    r0, r1 = dumps(save, 2)
    (ref,) = dumps(one_rank[0], 1)
    # every rank holds the same weights and the same anchor
    for k in r0["model"]:
        assert torch.equal(r0["model"][k], r1["model"][k]), k
    a0, a1, aref = anchors(r0["optimizer"]), anchors(r1["optimizer"]), anchors(ref["optimizer"])
    assert len(a0) == len(aref) == 41
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a0, a1, aref))
    # N workers with batch B == one worker with --update-freq N and batch B
    assert close(r0["model"], ref["model"])
    moved = max((ref["model"][k] - load_ckpt(tiny.pretrained)["model"][k]).abs().max().item()
                for k in ref["model"] if k in load_ckpt(tiny.pretrained)["model"])
    assert moved > 100 * ATOL  # the comparison is not vacuous
    steps = {st.get("step") for st in r0["optimizer"]["state"].values()} - {None}
    assert steps == {12}


def test_metrics_are_one_value_not_a_sum_over_ranks(tiny, tmp_path, one_rank):
    launch(tiny, tmp_path / "two", 2)
    (text,) = [open(tmp_path / "two" / "rank0.log").read()]

    two, one = json_records(text, "train_inner"), json_records(one_rank[1], "train_inner")
    assert [x["num_updates"] for x in two] == [x["num_updates"] for x in one] == ["4", "8", "12"]
    for a, b in zip(two, one):
        assert float(a["recadam_lambda"]) == float(b["recadam_lambda"])
        assert float(a["recadam_dist"]) == pytest.approx(float(b["recadam_dist"]), rel=1e-3)


def test_checkpoint_of_two_ranks_resumes_on_one(tiny, tmp_path, one_rank):
    """Saved by 2 workers after 6 updates, resumed by 1 worker with --update-freq 2."""
    save = tmp_path / "mixed"
    launch(tiny, save, 2, "--max-update", "6")
    six = load_ckpt(save / "checkpoint_last.pt")["model"]
    texts = launch(tiny, save, 1, "--update-freq", "2", "--restore-file", str(save / "checkpoint_last.pt"),
                   restore=False)
    assert "θ* restored from the checkpoint's optimizer state" in texts[0]
    (got,) = dumps(save, 1)
    (ref,) = dumps(one_rank[0], 1)
    # t continued from 6 to 12 (tensors the classifier never uses had zero gradients under DDP,
    # no gradient on one worker: their t stopped at 6, as it should)
    for i, st in ref["optimizer"]["state"].items():
        if "step" in st:
            assert got["optimizer"]["state"][i]["step"] == 12
    assert all(torch.equal(x, y) for x, y in zip(anchors(got["optimizer"]), anchors(ref["optimizer"])))
    # fairseq restores the data iterator per shard, so 2 -> 1 workers sees the batches in another
    # order than a straight run: the weights continue from the checkpoint but are not comparable
    assert not close(got["model"], six, atol=1e-6)


def test_fsdp_stops_at_start(tiny, tmp_path):
    """On a CPU fairscale's FSDP stops fairseq-train (it needs CUDA) before recadam's one-line refusal, which
    tests/test_sharding.py checks in-process and the GPU pass through fairseq-train (tests/test_flat_shards.py)."""
    rc, log = tiny.train(tmp_path / "s", "--ddp-backend", "fully_sharded", check=False)
    assert rc != 0
    assert "recadam does not support" in log or "fairscale" in log  # fairseq checks fairscale first


@pytest.mark.gpu
def test_pytorch_ddp_on_gpus(tiny, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    launch(tiny, tmp_path / "ddp", 2, backend="pytorch_ddp", device="cuda")
    launch(tiny, tmp_path / "one", 1, "--update-freq", "2", device="cuda")
    r0, r1 = dumps(tmp_path / "ddp", 2)
    (ref,) = dumps(tmp_path / "one", 1)
    assert close(r0["model"], r1["model"], atol=0)
    assert close(r0["model"], ref["model"], atol=1e-4)  # NCCL reduction order, TF32 off by default


def _dists(text):
    return [float(r["recadam_dist"]) for r in json_records(text, "train_inner")]


def two_ranks_on_one_device(tiny, root, device):
    """Two ranks sharing one device (gloo) under --fp16, against one rank with --update-freq 2, and
    --zero-sharding os against the unsharded pair (--memory-efficient-fp16: fairseq refuses ZeRO with flat grads,
    recadam with fp32 master copies). Returns {name: (dumps, rank-0 log)}."""
    fp16 = ["--fp16"]
    runs = {}

    def job(name, world, *flags):
        def go():
            texts = launch(tiny, root / name, world, *fp16, *flags, device=device, one_gpu=device == "cuda")
            # under OSS only rank 0 holds the consolidated optimizer state its dump needs
            return {name: (dumps(root / name, 1 if "os" in flags else world), texts[0])}
        return go

    runs.update(run_jobs([job("one", 1, "--update-freq", "2"), job("two", 2)]))
    runs.update(run_jobs([job("plain", 2, "--memory-efficient-fp16"),
                          job("os", 2, "--memory-efficient-fp16", "--zero-sharding", "os")]))
    return runs


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_fp16(tiny, tmp_path):
    """The flat --fp16 path's gradient reduction on CUDA (both ranks on cuda:0 over gloo) equals one rank with
    --update-freq 2 up to fp16 rounding; ZeRO-1 on that pair equals the unsharded pair likewise."""
    runs = two_ranks_on_one_device(tiny, tmp_path, "cuda")
    start = load_ckpt(tiny.pretrained)["model"]
    (one,), _ = runs["one"]
    (r0, r1), two_log = runs["two"]
    for k in r0["model"]:
        assert torch.equal(r0["model"][k], r1["model"][k]), k  # the ranks hold one model
    gap = relative_gap(r0["model"], one["model"], start)
    (p0, _), plain_log = runs["plain"]
    (o0,), os_log = runs["os"]
    os_gap = relative_gap(o0["model"], p0["model"], start)
    dist = (_dists(two_log), _dists(runs["one"][1]), _dists(plain_log), _dists(os_log))
    print(f"two ranks on one GPU vs --update-freq 2: weights' update {gap:.2e} apart (relative L2); "
          f"zero-sharding os vs unsharded: {os_gap:.2e}; recadam_dist two/one/plain/os: {dist}")
    assert gap < 0.05 and os_gap < 0.05
    assert dist[0] == pytest.approx(dist[1], rel=0.05) and dist[3] == pytest.approx(dist[2], rel=0.05)


def test_launch_script_cpu_local_and_dry_runs(tiny, tmp_path):
    script = os.path.join(os.path.dirname(TRAIN_ENTRY), "..", "scripts", "launch_multinode.sh")
    save = tmp_path / "launched"
    args = [a for a in tiny.finetune_args(save, *DIST_FLAGS, "--max-update", "4") if a != "--cpu"]
    env = dict(os.environ, NUM_PROCS="2", MASTER_PORT=str(free_port()), FAIRSEQ_TRAIN=fast_train())
    out = subprocess.run(["bash", script, "cpu-local", *args], env=env, capture_output=True, text=True, cwd=tiny.root)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    ck = load_ckpt(save / "checkpoint_last.pt")
    assert ck["cfg"]["distributed_training"]["distributed_world_size"] == 2
    assert ck["optimizer_history"][-1]["num_updates"] == 4
    env.update(DRY_RUN="1", NUM_GPUS="8", NNODES="2", NODE_RANK="1", MASTER_ADDR="node0", FAIRSEQ_TRAIN="fairseq-train")
    out = subprocess.run(["bash", script, "torchrun", "data-bin", "--optimizer", "recadam"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert "--nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr node0" in out.stdout
    assert "--distributed-world-size 16" in out.stdout
    out = subprocess.run(["bash", script, "slurm", "data-bin"], env=env, capture_output=True, text=True)
    assert "srun" in out.stdout and "--ntasks-per-node 8" in out.stdout
    out = subprocess.run(["bash", script, "nonsense"], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "unknown MODE" in out.stderr
