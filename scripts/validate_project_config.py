#!/usr/bin/env python3
"""Validate a deepdanbooru project.json; runs from a checkout, without TensorFlow.

    python scripts/validate_project_config.py PROJECT [--check-paths] [--format text|json]
"""

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # validation writes nothing, not even __pycache__ in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deepdanbooru.preflight.main import script, validate_project_config_main  # noqa: E402

if __name__ == "__main__":
    script(validate_project_config_main)
