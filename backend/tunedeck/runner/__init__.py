"""The per-job process: starts LLaMA-Factory, follows it, reports to the server."""
