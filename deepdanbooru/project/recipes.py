"""create-project --recipe: named sets of project.json values laid over the defaults.

`deepdanbooru` is the defaults themselves (DeepDanbooru's recipe). `modern`
takes the values bench/quality.py measured at equal time on the hard sample
(docs/quality.md: ahead on macro-F1 at a fixed threshold, even on mAP), which reads them from here,
so the bench and create-project never disagree. Change them here only.
"""

from __future__ import annotations

RECIPES: dict[str, dict] = {
    "deepdanbooru": {},
    # Measured on the 2-core machine at equal time (docs/quality.md): on CPU-size images resnet_small
    # trains 3-10 times the samples a second of the modern backbones and wins at equal time, so it is
    # the trunk here, with sample-project's step schedule over 40 epochs (it beat warmup_cosine); ASL is
    # the part that moved macro-F1. EMA, mixup, flips, random crops and log-frequency tag weights
    # measured no gain (mixup a loss) and are left out: docs/quality.md has their numbers.
    "modern": {
        "model": "resnet_small",
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "learning_rate": 0.002,
        "learning_rates": [{"used_epoch": 27, "learning_rate": 0.0005},
                           {"used_epoch": 37, "learning_rate": 0.0002}],
        "epoch_count": 40,
        "loss": "asymmetric",
    },
}
DEFAULT_RECIPE = "deepdanbooru"
