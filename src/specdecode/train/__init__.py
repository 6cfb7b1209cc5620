"""Training drafters for a target by self-distillation: `specdecode train data|medusa|eagle|draft`.

data.py      the target's own responses to prompt sets, stored as token ids
features.py  one teacher-forced target forward per sequence: hidden states and captured layers
(checkpoint files and the target they belong to: specdecode.backends.checkpoint)
loop.py      the shared training loop: seed, batches, tqdm, atomic checkpoints, --resume, loss PNG
corpus.py    what every trainer starts from: the data, its features, the held-out split, the draft vocabulary
medusa.py, eagle.py, draft.py   one trainer per drafter (the models live in specdecode.drafters)
cli.py       the `train` subcommands
"""
