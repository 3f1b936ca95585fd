"""Code that runs only inside the trainer's Python, started by path; it imports nothing of tunedeck.

A package of its own, in trainer/ outside the server's backend/ tree (one wheel ships both), so that
nothing under tunedeck (server, runner, CLI) ever imports torch, transformers or LLaMA-Factory, while
the runner can still find the script's file."""
