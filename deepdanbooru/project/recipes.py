"""create-project --recipe: named sets of project.json values laid over the defaults.

`deepdanbooru` is the defaults themselves (DeepDanbooru's recipe). `modern`
is issue 17's: its values are the ones bench/quality.py measured best at
equal time on the hard sample (docs/quality.md), which reads them from here,
so the bench and create-project never disagree. Change them here only.
"""

from __future__ import annotations

RECIPES: dict[str, dict] = {
    "deepdanbooru": {},
    "modern": {
        "model": "efficientnetv2_b0",
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "learning_rate": 0.002,
        "lr_schedule": "warmup_cosine",
        "warmup_epochs": 1,
        "min_learning_rate": 0.00001,
        "loss": "asymmetric",
        "tag_loss_weights": "log_frequency",
        "head_bias_init": "log_prior",
        # An average over the last ~500 steps: a 10-minute CPU run takes a few thousand, and at timm's
        # 0.9998 the average would still mostly hold the first weights when the budget ends.
        "ema_decay": 0.998,
        "horizontal_flip": True,
        "crop_area_range": [0.87, 1.0],
        "mixup": 0.2,
    },
}
DEFAULT_RECIPE = "deepdanbooru"
