"""export-bundle's conversion of every model-table row, side by side: seconds to convert and the largest
difference between onnxruntime and Keras on the 8 sample inputs.

    python bench/bundle_networks.py [--rows resnet_152,convnext_small] [--tags 5]

Each row is built with random weights at the smallest size it takes (32 px, resnet_152 193 px), converted as
export-bundle converts (the tools' BGR 0-255 input, the row mapping) and run through onnxruntime.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="comma-separated model names (default: every row)")
    parser.add_argument("--tags", type=int, default=5)
    args = parser.parse_args()
    from deepdanbooru.inference.bundle import convert_for_tools
    from deepdanbooru.inference.convert import FLOAT_TOLERANCE
    from deepdanbooru.models import build_model, minimum_input_size, model_names

    rows = args.rows.split(",") if args.rows else list(model_names())
    sources = [*range(args.tags)][::-1] + [None]
    failed = 0
    for name in rows:
        size = max(32, minimum_input_size(name))
        model = build_model(name, (size, size, 3), args.tags, seed=1)
        started = time.perf_counter()
        try:
            _, _, difference, samples, _ = convert_for_tools(model, sources, size, FLOAT_TOLERANCE,
                                                             Path("model.onnx"))
            outcome = f"largest difference {difference:.2g} on {samples} inputs"
        except Exception as error:  # a row that fails is reported, and the others still run
            failed += 1
            outcome = f"FAILED: {type(error).__name__}: {str(error)[:200]}"
        print(f"{name:<20} {size:>4} px  {time.perf_counter() - started:6.1f} s  {outcome}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
