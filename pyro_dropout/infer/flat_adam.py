"""Adam on one flat buffer that holds every parameter, gradient and moment.

Why our own (measured on the speed benchmark's W1 workload, 8-50-1, batch 32, one CPU thread,
torch 2.13, 2026-11-29, one process, 7 interleaved rounds, UCI runs paused): a step of
``torch.optim.Adam(fused=True)`` over the 4-8 parameter tensors of a small guide costs more
than the arithmetic around it (its ``Optimizer.step`` wrapper: profiler hook, hook loops,
``_init_group``, grouping by device and dtype), ~0.35-0.75 ms of a 1.8-3.3 ms training step;
the same Adam over one flat tensor still ~0.2-0.4 ms. Done here as seven in-place tensor
operations on one buffer (a prototype of this module, before its commit `567df84`), fit's
whole step got 0.3-0.75 ms faster (AutoDropout 1.83 -> 1.40 ms, AutoMeanField 2.03 -> 1.71,
AutoConcreteDropout 3.32 -> 2.57; plain ``nn.Dropout`` step 1.1-1.3 ms; the A/B of the
committed code is on ``docs/benchmarks/speed.md``). Building no ``torch.optim`` optimiser also
spares the first step the import of ``torch._dynamo`` that the first optimiser of a process
triggers (seconds on a slow host).

How: each parameter is re-homed (``Tensor.set_``, public) onto a slice of one flat tensor and
its ``.grad`` is a view of one flat gradient buffer, so backward accumulates into the buffer
in place, and Adam (Kingma & Ba 2015, with ``amsgrad``, ``maximize`` and decoupled decay off)

    m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2,
    theta <- theta - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),

(``g <- g + weight_decay * theta`` first, L2 decay) is one call of torch's own update on the
buffer, the functional ``torch.optim.adam.adam`` (public: its module's ``__all__``; the
arithmetic of ``torch.optim.Adam.step`` without the ``Optimizer`` wrapper): its fused kernel
where the caller asked for it (``fused_adam``, fit's default), else, or where the device and
dtype have none, its single-tensor update. A buffer of at most :data:`INLINE_MAX` elements on
the CPU (the small networks where a step's fixed costs dominate) runs that single-tensor
arithmetic inline, without the functional wrapper's Python. The fused kernel is one pass over memory where the
same update by hand makes seven. Measured (one CPU thread, torch 2.13, 2026-11-29, UCI runs
paused), the update alone, by hand (seven in-place operations, this module at ``567df84``) vs
fused: 503 elements (W1) 62 vs 69 us, 10^4 89 vs 80, 10^5 356 vs 236, 7 x 10^5 3,994 vs
1,430 us; in fit's step (the speed workloads, one process, interleaved rounds, ratio to the
plain step) at W2 (4.8 x 10^5 elements for the dropout guides, 9.6 x 10^5 for mean-field and
VD), fused / by hand: AutoDropout 1.11 / 1.27, Concrete 1.48 / 1.62, mean-field 1.96 / 2.15,
VD 1.53 / 1.79; at W1 equal within the noise (1.26 / 1.24, 2.45 / 2.47, 1.86 / 1.87, 1.81 /
1.75). Exact only while every parameter steps every step with one step count:
:class:`FusedOptim` hands the state to a ``torch.optim.Adam`` as soon as that stops being
true.
"""

from typing import Any

import torch
from torch.optim.adam import adam

__all__ = ["FlatAdam", "flat_adam_args", "flat_eligible"]

_ADAM_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
# Arguments that select an implementation, not the update: the flat step ignores them.
_IMPLEMENTATION = {"fused", "foreach", "capturable", "differentiable"}
#: Up to this many elements on the CPU, the fused step runs torch's single-tensor arithmetic
#: inline instead of calling ``adam``: measured inside fit's W1 step (503 elements, one CPU
#: thread, torch 2.13, 2026-11-29, fastest of 15 rounds), ``adam(fused=True)`` cost 49 us and
#: the seven in-place operations 41 us (the kernel itself ~21 us: the rest is the functional
#: wrapper's Python, argument checks and grouping by device). From ~10^4 elements the fused
#: kernel's single pass wins (see above); on a GPU it is one launch against seven.
INLINE_MAX = 4096


def flat_adam_args(optim_constructor: Any, optim_args: dict[str, Any]) -> dict[str, Any] | None:
    """The hyperparameters of a plain ``torch.optim.Adam`` (``lr``, ``betas``, ``eps``,
    ``weight_decay``, all numbers) if ``optim_constructor(params, **optim_args)`` is one
    that :class:`FlatAdam` steps exactly, else ``None``."""
    if optim_constructor is not torch.optim.Adam:
        return None
    off = {"amsgrad", "maximize", "decoupled_weight_decay"}
    out: dict[str, Any] = dict(_ADAM_DEFAULTS)
    for key, value in optim_args.items():
        if key in _IMPLEMENTATION or (key in off and value is False):
            continue
        if key not in _ADAM_DEFAULTS:
            return None
        out[key] = value
    betas = out["betas"]
    numbers = [out["lr"], out["eps"], out["weight_decay"], *betas]
    if len(betas) != 2 or not all(type(x) in (int, float) for x in numbers):
        return None  # e.g. a tensor learning rate: torch's Adam handles it
    return out


def flat_eligible(params: list[torch.Tensor]) -> bool:
    """One flat buffer can hold these: dense, non-empty, floating, one device and dtype, each
    with its gradient."""
    if not params:
        return False
    first = params[0]
    return all(
        p.layout == torch.strided
        and p.numel() > 0
        and p.is_floating_point()
        and p.dtype == first.dtype
        and p.device == first.device
        and p.grad is not None
        and p.grad.layout == torch.strided
        for p in params
    )


class FlatAdam:
    """Adam over ``params`` (in this order) on one flat buffer; see the module docstring.

    :param list params: leaf tensors; each is re-homed onto a slice of one flat tensor (its
        values, identity and ``requires_grad`` kept) and its gradient becomes a view of one
        flat gradient buffer. Raises ``RuntimeError`` where a tensor cannot be re-homed (e.g.
        one made by ``.detach()``).
    :param dict hyper: ``lr``, ``betas``, ``eps``, ``weight_decay`` (see :func:`flat_adam_args`).
    :param bool fused: step with torch's fused Adam kernel (its single-tensor update where the
        device or dtype has none, found at the first step), else the single-tensor update.
    """

    def __init__(
        self, params: list[torch.Tensor], hyper: dict[str, Any], fused: bool = False
    ) -> None:
        self.params = list(params)
        self.hyper = dict(hyper)
        self.fused = fused
        first = self.params[0]
        sizes = [p.numel() for p in self.params]
        total = sum(sizes)
        self.flat = torch.empty(total, dtype=first.dtype, device=first.device)
        self.flat_grad = torch.zeros_like(self.flat)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.step_count = 0
        # the fused kernel's step count: a float32 tensor on the device, as torch's Adam keeps it
        self._step = torch.zeros((), dtype=torch.float32, device=first.device)
        self.slices: list[slice] = []
        self.grads: list[torch.Tensor] = []
        start = 0
        with torch.no_grad():
            for p, n in zip(self.params, sizes, strict=True):
                sl = slice(start, start + n)
                segment = self.flat[sl].view(p.shape)
                segment.copy_(p)
                # same tensor object (the param store's), now on the buffer's storage
                p.set_(self.flat.untyped_storage(), start, segment.shape, segment.stride())
                grad = self.flat_grad[sl].view(p.shape)
                if p.grad is not None:
                    grad.copy_(p.grad)
                p.grad = grad
                self.slices.append(sl)
                self.grads.append(grad)
                start += n
        self._ptrs = [p.data_ptr() for p in self.params]
        self._inline = fused and first.device.type == "cpu" and total <= INLINE_MAX

    def ready(self) -> bool:
        """Whether the next step can be the flat one: every parameter still lives in the
        buffer and has a gradient (one replaced by another tensor, e.g. by Pyro's
        ``zero_grads``, is copied into the buffer)."""
        for p, grad, ptr in zip(self.params, self.grads, self._ptrs, strict=True):
            g = p.grad
            if g is not grad:
                if g is None:
                    return False
                grad.copy_(g)
                p.grad = grad
            if p.data_ptr() != ptr:
                return False  # re-homed by someone else (e.g. another FlatAdam)
        return True

    @torch.no_grad()
    def step(self) -> None:
        h = self.hyper
        beta1, beta2 = h["betas"]
        if self._inline:
            self._inline_step(h, beta1, beta2)
            return
        try:
            # torch.optim.adam.adam (public, in its module's __all__): the functional form of
            # torch.optim.Adam.step without the Optimizer wrapper, on the one flat buffer
            adam(
                [self.flat],
                [self.flat_grad],
                [self.exp_avg],
                [self.exp_avg_sq],
                [],
                [self._step],
                foreach=False,  # (single-tensor where not fused)
                fused=self.fused,
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=h["lr"],
                weight_decay=h["weight_decay"],
                eps=h["eps"],
                maximize=False,
            )
        except RuntimeError:
            if not self.fused or self.step_count:
                raise
            self.fused = False  # no fused kernel for this device or dtype: torch's single-tensor
            self._step.fill_(0.0)
            self.step()
            return
        self.step_count += 1

    def _inline_step(self, h: dict[str, Any], beta1: float, beta2: float) -> None:
        """``torch.optim.adam``'s single-tensor update, as written there (the same values to
        the bit; the fused kernel's within a few ulp), on the flat buffer."""
        self.step_count += 1
        t = float(self.step_count)
        grad = self.flat_grad
        if h["weight_decay"] != 0:
            grad = grad.add(self.flat, alpha=h["weight_decay"])
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = h["lr"] / (1 - beta1**t)
        denom = (self.exp_avg_sq.sqrt() / (1 - beta2**t) ** 0.5).add_(h["eps"])
        self.flat.addcdiv_(self.exp_avg, denom, value=-step_size)

    def zero_grad(self) -> None:
        """Zero the gradients in place (they stay views of the buffer)."""
        self.flat_grad.zero_()

    def param_state(self, i: int) -> dict[str, torch.Tensor]:
        """Parameter ``i``'s state in ``torch.optim.Adam``'s layout (copies)."""
        p, sl = self.params[i], self.slices[i]
        return {
            "step": torch.tensor(float(self.step_count)),
            "exp_avg": self.exp_avg[sl].view(p.shape).clone(),
            "exp_avg_sq": self.exp_avg_sq[sl].view(p.shape).clone(),
        }

    def state_dict(self, group: dict[str, Any]) -> dict[str, Any]:
        """``torch.optim.Adam(params, **group).state_dict()`` after the same steps: one
        group, state per parameter (step counts are float tensors, as torch keeps them)."""
        n = len(self.params)
        state = {i: self.param_state(i) for i in range(n)} if self.step_count else {}
        return {"state": state, "param_groups": [{**group, "params": list(range(n))}]}

    def load(self, state: dict[int, dict[str, torch.Tensor]]) -> bool:
        """Take per-parameter Adam state (``state_dict()["state"]`` of a one-group Adam over
        these parameters in this order); ``False`` (nothing changed) where it does not fit
        one flat step count: missing entries, unequal steps, AMSGrad's extra moment."""
        n = len(self.params)
        if not state:
            steps = {0.0}
        elif set(state) != set(range(n)):
            return False
        else:
            steps = {float(s["step"]) for s in state.values()}
            if any(set(s) != {"step", "exp_avg", "exp_avg_sq"} for s in state.values()):
                return False
        if len(steps) != 1:
            return False
        with torch.no_grad():
            for i, sl in enumerate(self.slices):
                if state:
                    self.exp_avg[sl].copy_(state[i]["exp_avg"].reshape(-1))
                    self.exp_avg_sq[sl].copy_(state[i]["exp_avg_sq"].reshape(-1))
            if not state:
                self.exp_avg.zero_()
                self.exp_avg_sq.zero_()
        self.step_count = int(steps.pop())
        self._step.fill_(self.step_count)
        return True
