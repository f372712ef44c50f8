#!/usr/bin/env python3
"""Read-only checks of a deepdanbooru project before training; runs from a checkout, without TensorFlow.

    python scripts/training_preflight.py PROJECT [--check-packages] [--max-image-checks N]
                                                 [--probe-imports] [--probe-tensorflow] [--format text|json]
"""

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # preflight writes nothing, not even __pycache__ in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deepdanbooru.preflight.main import script, training_preflight_main  # noqa: E402

if __name__ == "__main__":
    script(training_preflight_main)
