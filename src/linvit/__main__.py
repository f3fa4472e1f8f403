"""`python -m linvit ...` (what torchrun launches) runs the same CLI as the `linvit` script."""

import sys

from linvit.cli import main

sys.exit(main())
