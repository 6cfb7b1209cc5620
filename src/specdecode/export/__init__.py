"""Exports of a specdecode setup to other serving engines (vllm.py: `specdecode export vllm`)."""
