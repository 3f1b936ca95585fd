"""Placeholder for ``torchaudio`` installed by tunedeck.

It exists only so that modules importing ``torchaudio`` at import time (LLaMA-Factory's
``data/mm_plugin.py``) load on CPU-only setups where no PyPI torchaudio build matches torch.
Any actual audio operation raises :class:`RuntimeError`.
"""

from . import functional

__version__ = "0.0.0+tunedeck.placeholder"

PLACEHOLDER = True

_MESSAGE = (
    "torchaudio is a tunedeck placeholder (tunedeck-torchaudio-placeholder), not a real build: "
    "{what} is unavailable. Datasets with audio need a real torchaudio build that matches the "
    "installed torch ({torch_version}); run `pip uninstall tunedeck-torchaudio-placeholder` and "
    "install the torchaudio wheel for this torch version."
)


def _unavailable(what: str) -> RuntimeError:
    try:
        import torch

        torch_version = torch.__version__
    except (ImportError, OSError, AttributeError):  # torch missing or broken: keep the useful part
        torch_version = "unknown torch version"
    return RuntimeError(_MESSAGE.format(what=what, torch_version=torch_version))


def load(*args, **kwargs):
    """Always fails: reading audio needs a real torchaudio."""
    raise _unavailable("torchaudio.load")


__all__ = ["PLACEHOLDER", "__version__", "functional", "load"]
