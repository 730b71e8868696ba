"""Per-example gradients of a batch, many examples a pass (pure torch; no fairseq import).

g_i = ∂ℓ_i/∂θ for the examples i of a batch, where ``loss_fn(module, sample)`` gives one loss per example
(EWC's empirical Fisher (1/N)·Σ_i g_i², ``core/ewc.py``). Two ways:

- :class:`Vmapped`: torch.func's ``vmap(grad)`` over a chunk of examples, one pass for them all (as Opacus's
  functorch mode). fairseq's modules branch on the data (``if padding_mask.any()``), which vmap refuses, so
  one example's loss is first traced on real tensors (``make_fx``): the trace keeps the branches that example
  took. The batch is padded first (``pad``: a pad in every example, so that each takes the branch of a padded
  one, and a few lengths, so that a few traces serve every batch). Each chunk's traced losses are checked against
  ``loss_fn`` on the batch itself (one forward, no backward): a trace that is not the model's loss for some
  example raises :class:`NotBatchable` before its gradients are used.
- :func:`one_at_a_time`: one forward of the batch and one backward per example (the reference; the way left
  when the model cannot be traced or vmapped).

Memory of ``Vmapped``: a chunk's gradients, one tensor of the parameters' size per example.
"""

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

Sample = dict


class NotBatchable(Exception):
    """vmap cannot take this loss's per-example gradients (why, in one line)."""


class ChunkOutOfMemory(Exception):
    """A chunk's per-example gradients do not fit the device's memory (torch's OutOfMemoryError, from the vmap)."""


@contextlib.contextmanager
def _refusals(oom: Callable[[Exception], Exception]):
    """The trace's or vmap's refusal of the model's loss (an operation without a batching rule, a value read from the
    data: torch raises those as RuntimeError, NotImplementedError or fx's TraceError) as NotBatchable; torch's out of
    memory as ``oom(e)``. Anything else is a bug and is raised as it is, never taken for the slow way."""
    from torch.fx.proxy import TraceError

    try:
        yield
    except torch.OutOfMemoryError as e:
        raise oom(e) from e
    except (RuntimeError, NotImplementedError, TraceError) as e:
        raise NotBatchable(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e


def leaves(x, path=()) -> List[Tuple[tuple, object]]:
    """(path, value) of every leaf of nested dicts, lists and tuples."""
    if isinstance(x, dict):
        return [leaf for k in x for leaf in leaves(x[k], path + (k,))]
    if isinstance(x, (list, tuple)):
        return [leaf for i, v in enumerate(x) for leaf in leaves(v, path + (i,))]
    return [(path, x)]


def rebuild(x, values: Dict[tuple, object], path=()):
    """``x`` with the leaves at the paths of ``values`` replaced."""
    if isinstance(x, dict):
        return {k: rebuild(v, values, path + (k,)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(rebuild(v, values, path + (i,)) for i, v in enumerate(x))
    return values.get(path, x)


def _per_example(v, n: int) -> bool:
    return torch.is_tensor(v) and v.dim() >= 1 and v.size(0) == n


def rows(sample: Sample, n: int, start: int, stop: int) -> Sample:
    """Examples start..stop-1 of a batch of ``n``: every tensor with a row per example sliced, the rest kept."""
    return rebuild(sample, {p: v[start:stop] for p, v in leaves(sample) if _per_example(v, n)})


def one_at_a_time(module: torch.nn.Module, loss_fn: Callable, params: Sequence[Tensor], sample: Sample,
                  scale: Callable[[], float]) -> Iterator[List[Optional[Tensor]]]:
    """Each example's gradients of its loss × ``scale()`` (read for each example; a caller that lowers it after an
    overflow sends True to get that example's again): one forward of the batch, one backward per example."""
    losses = loss_fn(module, sample)
    i = 0
    while i < losses.numel():
        grads = torch.autograd.grad(losses[i] * scale(), params, retain_graph=True, allow_unused=True)
        again = yield list(grads)
        if again:
            yield None  # the reply to send(); the same example comes next
            continue
        i += 1


@contextlib.contextmanager
def swapped(module: torch.nn.Module, values: Dict[int, Tensor]):
    """Every slot of ``module`` that holds a parameter ``p`` with ``id(p)`` in ``values`` holds that value instead,
    until the block ends (a tied parameter in each of its slots; a module reached by two paths, once).
    torch.func.functional_call leaves such a module's weight swapped (its tied-weights restore)."""
    slots = {}
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and id(p) in values:
                slots[(id(m), name)] = (m, name, p)
    for m, name, p in slots.values():
        m._parameters[name] = values[id(p)]
    try:
        yield
    finally:
        for m, name, p in slots.values():
            m._parameters[name] = p


def _trace(module: torch.nn.Module, loss_fn: Callable, named: Sequence[Tuple[str, Tensor]], sample: Sample,
           paths: List[tuple]):
    """One example's loss, traced on the first example of ``sample`` (its ``paths`` the per-example tensors):
    a function f(params by name, *rows of one example) -> the loss, free of Python branches on the data."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def one(p, *xs):
        s = rebuild(sample, {path: x.unsqueeze(0) for path, x in zip(paths, xs)})
        with swapped(module, {id(t): p[n] for n, t in named}):
            return loss_fn(module, s).reshape(-1)[0]

    values = dict(leaves(sample))
    # attention as matmuls and softmax: vmap has no batching rule for the fused kernels' backward (a loop)
    with sdpa_kernel(SDPBackend.MATH):
        gm = make_fx(one, tracing_mode="real", _error_on_data_dependent_ops=False)(
            {n: t.detach() for n, t in named}, *[values[p][0] for p in paths])
    aten = torch.ops.aten
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten._local_scalar_dense.default:  # a value the Python code branched on: spent
            if node.users:
                raise NotBatchable("the loss computes with a number read from a tensor (.item())")
            gm.graph.erase_node(node)
        elif node.target in (aten.view.default, aten._unsafe_view.default):
            node.target = aten.reshape.default  # the trace's strides need not be vmap's
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


class Vmapped:
    """Per-example gradients of ``loss_fn`` w.r.t. ``named`` parameters of ``module``, ``chunk`` examples a vmap.
    ``pad(sample) -> sample``: the batch padded to a length many batches share, a pad in every example (None:
    traced per input shape). ``tolerance``: of the check of the traced losses, relative (absolute below 1)."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable, named: Sequence[Tuple[str, Tensor]], chunk: int,
                 pad: Optional[Callable[[Sample], Sample]] = None, tolerance: Optional[float] = None,
                 traced: Optional[Callable] = None):
        if int(chunk) < 1:
            raise ValueError(f"chunk {chunk}: must be >= 1")
        self.module, self.loss_fn, self.chunk, self.pad = module, loss_fn, int(chunk), pad
        self.traced = traced or loss_fn  # the same losses, in a form free of data-dependent shapes (masked LM's)
        self.named = list(named)
        self.params = {n: p.detach() for n, p in named}
        half = any(p.dtype in (torch.float16, torch.bfloat16) for _, p in named)
        self.tolerance = tolerance if tolerance is not None else (5e-2 if half else 1e-3)
        self.traces: Dict[tuple, object] = {}

    def _key(self, sample: Sample, n: int) -> tuple:
        key = []
        for path, v in leaves(sample):
            if _per_example(v, n):
                key.append((path, tuple(v.shape[1:]), v.dtype, v.device))
            elif torch.is_tensor(v):  # its values would be the trace's constants
                raise NotBatchable(f"the batch's {'.'.join(map(str, path))} is a tensor without a row per example")
            else:
                key.append((path, v))
        return tuple(key)

    def grads(self, sample: Sample, n: int, scale: Callable[[], float]) -> Iterator[Dict[str, Tensor]]:
        """Each chunk's gradients {name: [c, *shape]} of the losses × ``scale()`` (read for each chunk; send True to
        get the chunk again, e.g. at a lower scale after an overflow), in example order. NotBatchable: the trace
        or vmap refused the loss, or a chunk's traced losses are not ``loss_fn``'s (raised before that chunk is
        yielded); any other error (of ``pad``, ``loss_fn``, ...) is raised as it is."""
        from torch.func import grad_and_value, vmap

        padded = self.pad(sample) if self.pad is not None else sample
        key = self._key(padded, n)
        paths = [p for p, v in leaves(padded) if _per_example(v, n)]
        with torch.no_grad():
            want = self.loss_fn(self.module, sample).detach().reshape(-1)
        gm = self.traces.get(key)
        if gm is None:
            # one example's trace out of memory: not what the chunk's size bounds
            with _refusals(lambda e: NotBatchable(f"out of memory tracing one example ({str(e).splitlines()[0]})")):
                gm = self.traces[key] = _trace(self.module, self.traced, self.named, padded, paths)
        values = dict(leaves(padded))
        s = 0
        while s < n:
            xs = [values[p][s:s + self.chunk] for p in paths]
            k = scale()

            def scaled(p, *x):
                loss = gm(p, *x)
                return loss * k, loss

            # randomness "same": eval mode's random draws decide nothing (LayerDrop draws even there)
            with _refusals(lambda e: ChunkOutOfMemory(str(e).splitlines()[0])):
                grads, (_, loss) = vmap(grad_and_value(scaled, has_aux=True), in_dims=(None,) + (0,) * len(paths),
                                        randomness="same")(self.params, *xs)
            self._check(loss.detach(), want[s:s + loss.numel()])
            again = yield grads
            if again:
                yield None  # the reply to send(); the same chunk comes next
                continue
            s += loss.numel()

    def _check(self, traced: Tensor, want: Tensor) -> None:
        gap = (traced.to(want.dtype) - want).abs()
        if traced.shape != want.shape or not bool((gap <= self.tolerance * want.abs().clamp(min=1.0)).all()):
            worst = f"{float(gap.max()):.3g}" if traced.shape == want.shape else "shape"
            raise NotBatchable(f"the traced per-example loss is not the model's ({worst} off: code that branches on "
                               f"the data)")
