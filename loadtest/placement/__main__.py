"""``python -m loadtest.placement``: the placement study's command, as ``python -m loadtest
placement`` runs it.

Layer: ROOT. Only hands argv to ``loadtest.placement.study.main``; must not do anything
else.
"""

from __future__ import annotations

import sys

from loadtest.placement.study import main

if __name__ == "__main__":
    sys.exit(main())
