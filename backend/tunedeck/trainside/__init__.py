"""Code that runs inside the trainer's Python, started by path: it imports nothing of tunedeck."""
