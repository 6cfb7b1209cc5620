"""`specdecode audit`: does speculation change the output distribution, for this target, these
drafters, these prompts and temperatures? (docs/audit.md)

stats.py    pure: views of the first m tokens, TV, permutation p-value, Holm adjustment
run.py      sources (a loaded target; a running server), the audit itself, its table
cli.py      the subcommand
"""
