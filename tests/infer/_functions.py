"""Functions the capture tests share."""

import torch


class Square(torch.autograd.Function):
    """A custom autograd function: its forward runs outside torch's Python API (a capture
    records the operations inside it without their gradient), so a replay of the capture
    cannot reproduce its gradients."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad
