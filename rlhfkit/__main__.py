"""``python -m rlhfkit`` is the ``rlhfkit`` command (so ``torchrun -m rlhfkit rl ...`` works)."""

import sys

from .cli import main

sys.exit(main())
