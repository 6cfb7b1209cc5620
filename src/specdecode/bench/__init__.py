"""Benchmarks: the suite runner (suite.py), peers (Hugging Face generate, assisted generation, prompt
lookup), plots, and per-task advice. Imports the core, backends and drafters, never a serving wing."""
