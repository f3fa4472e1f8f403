"""The one exception type for input a user can fix.

``UsageError`` marks a bad path, size, name, option or data file: the command line prints it as one line and
exits 2 (``--debug`` shows its traceback too). Every other exception, including a ValueError from torch, timm or
a bug in linvit, keeps its traceback. A ValueError subclass, so code that catches ValueError keeps working.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad input the user can fix; the message says what and, where it helps, how."""
