"""Offline in one step, not fifty seconds: where the Hugging Face Hub's host does not resolve and no proxy is set,
huggingface_hub is put in offline mode before a command that may download weights.

Without it, `--pretrained` weights missing from the cache on a machine without network take huggingface_hub's
five retries with back-off (about 50 s here) before the CLI's one-line error. A name that does not resolve with no
proxy configured cannot reach the Hub, so offline mode loses nothing: cached files load as before, missing ones
fail at once. Behind a proxy the local resolver may not know the Hub's name while the proxy does, so nothing is
probed there.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
HUB = "https://huggingface.co"


def hub_host_unresolvable() -> bool:
    """The Hub's host (HF_ENDPOINT's, else huggingface.co) does not resolve and no proxy is configured, nor
    offline mode already asked for."""
    if any(os.environ.get(v) for v in PROXY_VARIABLES) or os.environ.get("HF_HUB_OFFLINE"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT") or HUB).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, 443)
    except socket.gaierror:
        return True
    except OSError:  # any other failure says nothing certain about the network: leave huggingface_hub to it
        return False
    return False


def offline_if_hub_unresolvable() -> bool:
    """huggingface_hub in offline mode for this process where the Hub cannot be named; True when it was set."""
    if not hub_host_unresolvable():
        return False
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    constants.HF_HUB_OFFLINE = True
    return True
