"""The core: the primitives below the drafters and the decoding loop, pure functions of tensors and
token ids: sampling (sampling.py), verification of a chain or a tree of drafts (verify.py,
tree_verify.py), token trees (tree.py), what the target checks in a step (plan.py), the drafter
protocol and its proposals (drafter.py), metrics and task labels. It imports no model code, no
drafter and nothing of decoding/ (pyproject.toml's contracts), so the drafters and the loop share
one vocabulary."""
