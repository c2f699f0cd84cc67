import pytest
import torch


@pytest.fixture
def one_thread():
    """Small matrices: one thread is faster on the shared 2-core runners (the UCI CLI runs
    with one too); the UCI engine's tests ask for it with ``usefixtures``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
