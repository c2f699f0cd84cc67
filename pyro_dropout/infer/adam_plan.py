"""Adam's steady-state step as one call of torch's fused kernel.

Why: once a fit's parameters stop changing (every step after the first few), a step of
``torch.optim.Adam(fused=True)`` still rebuilds its lists of parameters, gradients and state
(``_init_group``: a dict lookup per parameter), groups them by device and dtype, and increments
each parameter's step counter in its own ``_foreach_add_`` slot, before one fused update does
the arithmetic. Measured at the speed benchmark's W1 workload (8-50-1, mean-field's 8 parameter
tensors, one CPU thread): ``Adam.step`` 68–74 µs, its body without the wrapper
(:func:`~pyro_dropout.infer.optim._lean_adam_step`) 56–62 µs, the fused kernel alone 6 µs, and
this plan (cached lists, the step counters as views of one tensor, so one ``add_`` advances
them all) 16–18 µs — of a ~0.5 ms step. The update is torch's own kernel with torch's own
arguments, so it is the same bit for bit (``tests/infer/test_fused_optim.py``).
"""

import torch

__all__ = ["AdamPlan", "no_step_hooks"]

_REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def no_step_hooks(opt):
    """Whether no step hook (the optimiser's or torch's global ones) would run around a step."""
    from torch.optim import optimizer as _optimizer

    return not (
        opt._optimizer_step_pre_hooks
        or opt._optimizer_step_post_hooks
        or _optimizer._global_optimizer_pre_hooks
        or _optimizer._global_optimizer_post_hooks
    )


class AdamPlan:
    """The lists ``torch._fused_adam_`` takes, for the one parameter group of a
    ``torch.optim.Adam(fused=True)`` after its first step, kept while nothing they depend on
    changes.

    :meth:`build` returns ``None`` unless the optimiser is a plain fused Adam (one parameter
    group; no AMSGrad, differentiable, capturable, tensor learning rate or betas, gradient
    scaling; every parameter a real dense tensor on one device with one dtype and a state). It
    then re-points each parameter's ``state["step"]`` at a view of one tensor of counters (the
    same values; each parameter keeps its own counter, so ``Adam.step`` and ``state_dict``
    still see one per parameter). :meth:`step` updates where :meth:`matches` holds: the same
    optimiser state and group objects (``load_state_dict`` and ``add_param_group`` replace or
    add them), no step hooks, exactly the group's parameters, each with a gradient.
    Hyperparameters (``lr``, betas, ``eps``, ``weight_decay``, ``maximize``) are read from the
    group at every step, so learning-rate schedulers work.
    """

    def __init__(self, opt, group, params, steps):
        self._opt, self._group, self._state = opt, group, opt.state
        self.params = params
        self._ids = frozenset(map(id, params))
        state = opt.state
        self.exp_avgs = [state[p]["exp_avg"] for p in params]
        self.exp_avg_sqs = [state[p]["exp_avg_sq"] for p in params]
        self._steps = steps
        self.step_views = list(steps.unbind(0))
        for p, view in zip(params, self.step_views, strict=True):
            state[p]["step"] = view

    @classmethod
    def build(cls, opt, params):
        """The plan for ``opt`` stepping exactly ``params``, or ``None`` (see the class)."""
        if type(opt) is not torch.optim.Adam or not hasattr(torch, "_fused_adam_"):
            return None
        if len(opt.param_groups) != 1 or not no_step_hooks(opt):
            return None
        group = opt.param_groups[0]
        members = group["params"]
        if not group.get("fused") or group.get("amsgrad") or group.get("differentiable"):
            return None
        if group.get("capturable") or torch.is_tensor(group["lr"]):
            return None
        if any(torch.is_tensor(beta) for beta in group["betas"]):
            return None
        if getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None):
            return None
        if len(members) != len(params) or set(map(id, members)) != set(map(id, params)):
            return None
        p0 = members[0]
        keys = {"step", "exp_avg", "exp_avg_sq"}
        for p in members:
            if p.device != p0.device or p.dtype != p0.dtype or p.dtype not in _REAL:
                return None
            if p.layout != torch.strided or not keys <= set(opt.state.get(p, ())):
                return None
        steps = [opt.state[p]["step"] for p in members]
        if any(s.shape != () or s.dtype != steps[0].dtype or s.device != steps[0].device
               for s in steps):  # fmt: skip
            return None
        return cls(opt, group, list(members), torch.stack(steps))

    def matches(self, opt, params):
        """Whether :meth:`step` applies to ``opt`` stepping ``params``."""
        return (
            opt is self._opt
            and opt.state is self._state
            and len(opt.param_groups) == 1
            and opt.param_groups[0] is self._group
            and no_step_hooks(opt)
            and frozenset(map(id, params)) == self._ids
        )

    def step(self):
        """One Adam update of every parameter; ``False`` (nothing done) where one has no
        gradient (``Adam.step`` skips it, and its counter must not move)."""
        grads = [p.grad for p in self.params]
        if any(g is None or g.is_sparse for g in grads):
            return False
        g = self._group
        update = torch._fused_adamw_ if g.get("decoupled_weight_decay") else torch._fused_adam_
        beta1, beta2 = g["betas"]
        with torch.no_grad():
            self._steps.add_(1)
            update(
                self.params,
                grads,
                self.exp_avgs,
                self.exp_avg_sqs,
                [],
                self.step_views,
                amsgrad=False,
                lr=g["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=g["weight_decay"],
                eps=g["eps"],
                maximize=g["maximize"],
                grad_scale=None,
                found_inf=None,
            )
        self._opt._opt_called = True  # what Adam.step's wrapper records for lr schedulers
        return True
