"""Offline in one step, not fifty seconds: where the Hugging Face Hub's host does not resolve and no proxy is set,
huggingface_hub is put in offline mode before a command that may download weights.

Without it, `--pretrained` weights missing from the cache on a machine without network take huggingface_hub's
five retries with back-off (about 50 s here) before the CLI's one-line error. A name that does not resolve with no
proxy configured cannot reach the Hub, so offline mode loses nothing: cached files load as before, missing ones
fail at once. Behind a proxy the local resolver may not know the Hub's name while the proxy does, so nothing is
probed there. The CLI wraps every command that asks for Hub weights; linvit.create_model and the distillation
teachers wrap their own downloads, so a Python caller gets the same.
"""

from __future__ import annotations

import contextlib
import os
import socket
from urllib.parse import urlparse
from urllib.request import getproxies

HUB = "https://huggingface.co"


def hub_host_unresolvable() -> bool:
    """The Hub's host (HF_ENDPOINT's, else huggingface.co) does not resolve and no proxy is configured, nor
    offline mode already asked for."""
    proxies = {scheme for scheme in getproxies() if scheme != "no"}  # the environment's, and the OS's settings
    if proxies or os.environ.get("HF_HUB_OFFLINE"):  # on macOS and Windows; "no": NO_PROXY's exceptions
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


@contextlib.contextmanager
def offline_while_hub_unresolvable():
    """huggingface_hub in offline mode inside the block where the Hub cannot be named (its setting restored after);
    yields whether the block runs offline."""
    try:
        from huggingface_hub import constants
    except ImportError:
        yield False
        return
    before = constants.HF_HUB_OFFLINE
    offline = before or hub_host_unresolvable()  # already offline (an enclosing block, the user): no second probe
    constants.HF_HUB_OFFLINE = before or offline
    try:
        yield offline
    finally:
        constants.HF_HUB_OFFLINE = before
