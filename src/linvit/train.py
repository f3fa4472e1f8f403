"""Deprecated spelling of linvit.classify (the classification task became a package like segment and detect)."""

import warnings

from .classify import *  # noqa: F403

warnings.warn("linvit.train is now linvit.classify; import from there", DeprecationWarning, stacklevel=2)
