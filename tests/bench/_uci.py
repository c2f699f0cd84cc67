"""What the UCI benchmark's tests share."""

from pathlib import Path

#: The UCI benchmark with its published splits, beside the checkout (``../shared/data/uci``).
UCI_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "uci"


def yacht_argv(data_dir, out, guides, *extra):
    """The UCI driver's arguments for a quiet quick run on yacht (the benchmark tests' runs)."""
    return [
        "--data-dir",
        str(data_dir),
        "--datasets",
        "yacht",
        "--guides",
        guides,
        "--quick",
        "--quiet",
        "--out",
        str(out),
        *extra,
    ]
