import pytest
import torch

from ._uci import UCI_DIR


@pytest.fixture
def one_thread():
    """Small matrices: one thread is faster on the shared 2-core runners (the UCI CLI runs
    with one too); the UCI engine's tests ask for it with ``usefixtures``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir():
    """The UCI data folder; a missing one fails (CI has it beside the checkout)."""
    if not (UCI_DIR / "yacht" / "data.txt").is_file():
        pytest.fail(f"UCI benchmark data not found at {UCI_DIR} (expected ../shared/data/uci)")
    return UCI_DIR
