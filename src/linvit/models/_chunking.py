"""When inference runs token-chunked: the one rule every family with a chunked path follows."""

from __future__ import annotations

import torch

from ..errors import UsageError
from ..layers.graph_capture import stateless_call

# Inputs of at least AUTO_CHUNK_MIN_TOKENS tokens (a 4096 x 4096 image at patch 16) run in chunks of
# AUTO_TOKEN_CHUNK tokens unless the model's token_chunk says otherwise: at 9216 x 9216 the whole-tensor
# path of the 4-layer models needs ~16 GB, the chunked one a few N x C activations.
AUTO_CHUNK_MIN_TOKENS = 2**16
AUTO_TOKEN_CHUNK = 2**14


def check_token_chunk(setting: object) -> None:
    """A one-line ValueError for a token_chunk that is not "auto", None / 0 or a positive int."""
    if (
        setting == "auto"
        or setting is None
        or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0)
    ):
        return
    raise UsageError(f"token_chunk must be 'auto', None, 0 or a positive int; got {setting!r}")


def resolve_token_chunk(setting: int | str | None, num_tokens: int) -> int | None:
    """Tokens per chunk for a forward over num_tokens, or None for the whole-tensor path.

    setting: "auto" (AUTO_TOKEN_CHUNK from AUTO_CHUNK_MIN_TOKENS on), a chunk size, or None / 0 (off).
    Chunking is inference only: under autograd, torch.compile or tracing the whole-tensor path runs.
    """
    if torch.is_grad_enabled() or stateless_call():
        return None
    if setting == "auto":
        return AUTO_TOKEN_CHUNK if num_tokens >= AUTO_CHUNK_MIN_TOKENS else None
    return setting or None
