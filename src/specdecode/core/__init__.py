"""The engine core: the decoding loop for one sequence (decoder.py, generation.py) and for many
(batch_decoder.py), the step functions both share (step.py: check, commit; text.py: the public text
stream), the pure verifiers and samplers (verify.py, tree_verify.py, sampling.py, tree.py), metrics,
adaptive control and cost models, routing and task state. It imports no wing (server, train, export,
monitor, bench) and no drafter implementation beyond the protocol."""
