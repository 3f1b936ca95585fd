"""tunedeck: a team dashboard for launching and monitoring LLaMA-Factory fine-tunes."""

__version__ = "0.1.0"
