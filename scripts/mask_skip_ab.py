"""The causal converted forms' mask skip, A/B in one process: the sliding-window hybrid's prefill of one prompt
with transformers' q x q mask built, read and checked by every layer (the old path) and with the mask skipped
where SDPA would skip it (linvit.conversion.language.register_attention), alternating, best of 3, one thread.

    python scripts/mask_skip_ab.py                 # 8,192 tokens (docs/benchmarks.md, the hybrid table's prose)
    python scripts/mask_skip_ab.py --tokens 2048
"""

from __future__ import annotations

import argparse
import time

import torch
from hybrid_timing import models  # scripts/: the same GPT-2 shape and forms

from linvit.conversion import language_katz
from linvit.conversion.language import register_attention


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = models(args.tokens)["katz_infsa:hedgehog + window"]
    prompt = torch.randint(0, 256, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    seconds, logits = {False: [], True: []}, {}
    for _ in range(3):
        for skip in (False, True):
            register_attention(language_katz.ATTENTION_NAME, language_katz.katz_causal_attention, causal_skip=skip)
            with torch.no_grad():
                start = time.perf_counter()
                logits[skip] = model(prompt, use_cache=True).logits
                seconds[skip].append(time.perf_counter() - start)
    old, new = min(seconds[False]), min(seconds[True])
    print(f"{args.tokens} tokens: mask built and checked {old:.3f} s, skipped {new:.3f} s ({old / new:.2f}x faster; "
          f"the mask was {1 - new / old:.0%} of the prefill); max |logit difference| "
          f"{float((logits[True] - logits[False]).abs().max()):.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
