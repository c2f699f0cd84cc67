"""fit on data as users keep it: Dataset, DataLoader, a stream (IterableDataset)."""

import math

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import pyro_dropout as pd


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x.sum(-1) + 0.1 * torch.randn(n, generator=g)


class Spy(torch.nn.Module):
    """The model, recording the num_data it is called with."""

    max_plate_nesting = 1

    def __init__(self):
        super().__init__()
        self.model = pd.BayesianMLP(2, 1, hidden=(5,), tau=10.0)
        self.seen = []

    def forward(self, x, y=None, num_data=None):
        self.seen.append((x.shape[0], num_data))
        return self.model(x, y, num_data=num_data)


class Stream(IterableDataset):
    """Rows generated on the fly; one pass yields ``n`` rows."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        g = torch.Generator().manual_seed(1)
        for _ in range(self.n):
            x = torch.randn(2, generator=g)
            yield x, x.sum()


def test_dataset_size_scales_and_epochs_count_loader_steps():
    torch.manual_seed(0)
    x, y = _data(40)
    model = Spy()
    guide = pd.AutoDropout(model, dropout_rate=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    # eager: the spy records every step (a compiled loss runs the model only while tracing)
    losses = pd.fit(model, guide, loader, num_epochs=3, progress=False, seed=0, jit=False)
    assert len(losses) == 3 * math.ceil(40 / 16)  # the last, smaller batch is a step too
    steps = [s for s in model.seen if s[1] is not None]
    assert steps and all(num_data == 40 for _, num_data in steps)
    assert {rows for rows, _ in steps} == {16, 8}


def test_dataset_with_batch_size():
    x, y = _data(30)
    model = Spy()
    guide = pd.AutoMeanField(model)
    losses = pd.fit(
        model, guide, TensorDataset(x, y), batch_size=10, num_epochs=2, progress=False, seed=0
    )
    assert len(losses) == 6
    assert all(n == 30 for _, n in model.seen if n is not None)


def test_stream_needs_num_data_and_num_steps():
    model = Spy()
    guide = pd.AutoDropout(model, dropout_rate=0.1)
    with pytest.raises(ValueError, match="pass num_data=N"):
        pd.fit(model, guide, Stream(20), batch_size=5, num_steps=2, progress=False)
    with pytest.raises(ValueError, match="pass num_steps instead of num_epochs"):
        pd.fit(model, guide, Stream(20), batch_size=5, num_epochs=2, num_data=20, progress=False)


def test_stream_restarts_when_exhausted():
    model = Spy()
    guide = pd.AutoDropout(model, dropout_rate=0.1)
    loader = DataLoader(Stream(20), batch_size=8)  # 8, 8, 4 rows per pass
    losses = pd.fit(
        model, guide, loader, num_data=20, num_steps=7, progress=False, seed=0, jit=False
    )
    assert len(losses) == 7 and all(math.isfinite(v) for v in losses)
    steps = [s for s in model.seen if s[1] is not None]
    assert all(n == 20 for _, n in steps)
    assert [rows for rows, _ in steps][-7:] == [8, 8, 4, 8, 8, 4, 8]
