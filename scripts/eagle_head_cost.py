"""What one EAGLE-3 draft step costs beside a target, in target steps, before any head is trained.

    python3 scripts/eagle_head_cost.py [--target M] [--dtype gguf] [--vocabs 32768,16384,8192]
                                       [--widths 1,0.5] [--k 4] [--threads 2] [--repeats 9] [--out F.json]

A head of the target's shape (`train eagle`'s: its hidden size, heads, MLP width and three fused
layers) with random weights costs what a trained one does: the cost is the shape's. For each draft
vocabulary (the LM-head rows a draft step scores) and MLP width (x the target's intermediate size;
1 is what `train eagle` builds), decoding steps are replayed as the engine runs them: the head is fed
one new position's target features, then proposes a chain of k, on a context that grows a token a
step. Interleaved with the target's own decoding step T(1) in every round; medians over `--repeats`
rounds. Reported: T1_ms, and per vocabulary, width and k the step's draft time in ms and over T(1)
(k = 1 is one head pass, the feature row's; each further draft adds one). Run it with nothing else
running; the CPU and the kernels' ISA go into the output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None)
    p.add_argument("--dtype", default="gguf")
    p.add_argument("--vocabs", default="32768,16384,8192", help="draft vocabulary sizes")
    p.add_argument("--widths", default="1,0.5", help="MLP widths, x the target's intermediate size")
    p.add_argument("--k", type=int, default=4, help="the longest chain")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=100, help="prompt tokens before the replayed steps")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from specdecode.backends import models
    from specdecode.backends.precision import Precision
    from specdecode.core.sampling import Warp
    from specdecode.drafters.eagle import EagleDrafter
    from specdecode.drafters.eagle_head import EagleHead
    from specdecode.train.eagle import default_layers

    target = models.load(a.target, Precision.parse(a.dtype)).model
    cfg = target.hf.config
    hidden, layers = cfg.hidden_size, default_layers(cfg.num_hidden_layers)
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(target.vocab_size, (a.context,), generator=gen).tolist()
    target.reset()
    target.extend(torch.tensor(prompt), num_logits=1)

    def target_step() -> float:
        t0 = time.perf_counter()
        target.extend(torch.tensor([prompt[-1]]), num_logits=1)
        target.truncate(len(prompt))
        return time.perf_counter() - t0

    drafters = {}
    for vocab in (int(v) for v in a.vocabs.split(",")):
        for width in (float(w) for w in a.widths.split(",")):
            head = EagleHead(
                hidden,
                len(layers) * hidden,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                head_dim,
                int(cfg.intermediate_size * width),
                cfg.rms_norm_eps,
            )
            for param in head.parameters():
                param.data.normal_(0.0, 0.02, generator=gen)
            drafter = EagleDrafter(head, torch.arange(vocab), target, layers)
            drafter.begin(prompt)
            drafter.feed(torch.randn(len(prompt) - 1, len(layers) * hidden, generator=gen))
            drafters[vocab, width] = [drafter, list(prompt)]

    def draft_step(vocab: int, width: float, k: int) -> float:
        drafter, context = drafters[vocab, width]
        context.append(int(torch.randint(target.vocab_size, (1,), generator=gen)))  # a committed token
        drafter.feed(torch.randn(1, len(layers) * hidden, generator=gen))  # its row, as a step feeds it
        t0 = time.perf_counter()
        drafter.propose(context, k, Warp(), None)
        return time.perf_counter() - t0

    ks = range(1, a.k + 1)
    for _ in range(2):  # warm-up
        target_step()
        for key in drafters:
            for k in ks:
                draft_step(*key, k)
    plain, samples = [], {(*key, k): [] for key in drafters for k in ks}
    for _ in range(a.repeats):
        plain.append(target_step())
        for key in drafters:
            for k in ks:
                samples[(*key, k)].append(draft_step(*key, k))
    t1 = statistics.median(plain)
    report = {"T1_ms": round(1e3 * t1, 2), "layers": list(layers), "steps": []}
    print(f"target T(1) {1e3 * t1:.1f} ms; head on layers {list(layers)}")
    for (vocab, width, k), times in samples.items():
        ms = 1e3 * statistics.median(times)
        report["steps"].append(
            {"vocab": vocab, "width": width, "k": k, "ms": round(ms, 2), "of_T1": round(ms / 1e3 / t1, 3)}
        )
        print(f"vocab {vocab:>6} width {width:g} k {k}: {ms:6.2f} ms = {ms / 1e3 / t1:.3f} T(1)")
    if a.out:
        write_report(a.out, report, "eagle_head_cost.py", argv, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
