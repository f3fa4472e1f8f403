"""Where CPU bfloat16 inference spends its time, and the two fixes measured in docs/benchmarks.md (issue 48.2).

Prints, on this machine and threads:
1. the patch embedding alone: oneDNN's bf16 convolution of an NCHW image against the same product as one
   matrix multiply (models._patchify), at --res;
2. the whole model's bf16 forward with each embedding, interleaved in one process (--pairs pairs);
3. torch.profiler's op table of one bf16 forward (what is left that is not a product).

    python scripts/bf16_cpu_profile.py --model linear_infvit_4l_patch16_224 --res 1024 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import linvit  # noqa: F401 (registers the models)
from linvit.models._patchify import PatchifyConv2d


def best_ms(run, repeats: int = 5) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def embedding(model, x) -> None:
    proj = model.patch_embed.proj
    product = lambda: proj._as_product(x)  # noqa: E731
    conv = lambda: F.conv2d(x, proj.weight, proj.bias, stride=proj.stride)  # noqa: E731
    with torch.inference_mode(), bf16():
        print(
            f"patch embedding, bf16: convolution {best_ms(conv):.1f} ms, one matrix product {best_ms(product):.1f} ms"
        )


def interleaved(model, x, pairs: int) -> None:
    proj, times = model.patch_embed.proj, {"convolution": [], "product": []}
    with torch.inference_mode(), bf16():
        for _ in range(pairs + 1):  # the first pair warms both up
            for name, cls in (("convolution", torch.nn.Conv2d), ("product", PatchifyConv2d)):
                proj.__class__ = cls
                start = time.perf_counter()
                model(x)
                times[name].append((time.perf_counter() - start) * 1e3)
    proj.__class__ = PatchifyConv2d
    for name, ms in times.items():
        print(f"bf16 forward with the {name}: median {statistics.median(ms[1:]):.0f} ms, {[round(t) for t in ms[1:]]}")


def op_table(model, x) -> None:
    with torch.inference_mode(), bf16():
        model(x)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(x)
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=14))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="linear_infvit_4l_patch16_224")
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, x = timm.create_model(args.model, img_size=args.res).eval(), torch.randn(1, 3, args.res, args.res)
    embedding(model, x)
    interleaved(model, x, args.pairs)
    op_table(model, x)


if __name__ == "__main__":
    main()
