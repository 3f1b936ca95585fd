"""Placeholder for ``torchaudio.functional``; every operation raises RuntimeError."""


def resample(*args, **kwargs):
    """Always fails: resampling audio needs a real torchaudio."""
    from . import _unavailable

    raise _unavailable("torchaudio.functional.resample")


__all__ = ["resample"]
