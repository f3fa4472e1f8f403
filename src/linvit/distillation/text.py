"""Text for distilling a language model: a file or a folder of .txt files, as token windows.

Tokens come from the teacher's tokenizer when its folder has one, else from the bytes (ids 0-255, for models
trained on bytes such as docs/results.md's GPT-2). The last tenth of the text is the validation split; both
splits are cut into windows of context + 1 tokens (inputs and next-token targets), in order, without overlap.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import UsageError
from ..weights import check_exists

VAL_SHARE = 0.1


def read_text(path: str | Path) -> str:
    """A text file, or every .txt file below a folder in sorted order (joined by blank lines)."""
    path = check_exists(path)
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{path}: no .txt file in this folder")
    try:
        return "\n\n".join(f.read_text(encoding="utf-8") for f in files)
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text ({err.reason})") from err


def tokenize(text: str, tokenizer, vocab_size: int) -> torch.Tensor:
    """1-D int64 token ids: the tokenizer's, or the UTF-8 bytes; ids must fit the model's vocabulary."""
    if tokenizer is not None:
        ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
    else:
        if vocab_size < 256:
            raise UsageError(f"the teacher has no tokenizer and {vocab_size} token ids: bytes need 256")
        ids = torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
    return ids


class TokenWindows(Dataset):
    """Windows of context + 1 consecutive tokens: one every context tokens, or (random=N) N windows at random
    offsets, drawn anew by set_epoch from (seed, epoch), so a resumed run draws the same ones."""

    def __init__(self, ids: torch.Tensor, context: int, random: int | None = None, seed: int = 0) -> None:
        self.ids, self.context, self.random, self.seed = ids, context, random, seed
        self.count = random if random else max(0, (len(ids) - 1) // context)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        if self.random:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self.starts = torch.randint(0, len(self.ids) - self.context, (self.random,), generator=gen)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(self.starts[index]) if self.random else index * self.context
        return self.ids[start : start + self.context + 1]


def text_splits(
    path: str, tokenizer, vocab_size: int, context: int, train_windows: int | None = None, seed: int = 0
) -> tuple[TokenWindows, TokenWindows]:
    """(train, val) windows of the text at path; val is its last tenth, train_windows random windows of the
    rest an epoch (None: every window of it once)."""
    ids = tokenize(read_text(path), tokenizer, vocab_size)
    cut = int(len(ids) * (1 - VAL_SHARE))
    if cut <= context:
        raise UsageError(f"{path}: {cut} training tokens are too few for a window of {context + 1}")
    train, val = TokenWindows(ids[:cut], context, train_windows, seed), TokenWindows(ids[cut:], context)
    if len(val) == 0:
        raise UsageError(
            f"{path}: {len(ids)} tokens are too few for a validation window of {context + 1} in the last tenth"
        )
    return train, val
