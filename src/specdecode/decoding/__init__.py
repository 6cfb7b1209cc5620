"""Decoding: the loop for one sequence (decoder.py, generation.py: the tests' oracle and the loop to
read first; no tool runs it) and for many (batch_decoder.py, which the engine runs),
the step both share (step.py: check, settle; text.py: the public text stream), and the policy around
it: what a request changes in the target's distribution (constraints.py with penalties.py and
grammar.py; logprobs.py), adaptive k and cost models (control.py, step_fit.py), prefill
budgets and the prefix cache, routing and task state, memory estimates.

It sits above the drafters (it builds them from specs and drives them through core/drafter.py's
protocol) and the core's primitives, and imports no wing (pyproject.toml's contracts). Above it,
specdecode/engine is the one scheduler every way in drives (server, Python API, command line): it
runs this package's batched loop and asks its policies (router.py, control.py, constraints.py)."""
