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
    # The drops are fixed epochs of these 40; with epoch_count "fit" give them as used_fraction 0.675 and 0.925
    # (27/40 and 37/40), which the refusal of used_epoch under "fit" computes from the entries themselves.
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
    # For a --source-model start (an imported tagger or a timm folder). From the fine-tuning runs of
    # docs/quality.md (a small WD-v3-style ViT pretrained on other pictures, 6 minutes each): 1e-3 beat
    # 3e-4 on every figure, a head-only first epoch gained nothing, and more epochs in the same time beat
    # fewer; training only the last 2 blocks and the head (trainable_blocks 2) led full fine-tuning in all
    # four pairs run (1,000 and 2,672 posts, two seeds) at cheaper steps, in runs that ended early; in runs
    # that filled their 6 minutes (1,000 posts) 0, 1, 2, 4 and all 6 blocks tied within 0.012 mAP.
    # Optimizer, weight decay and loss are modern's, not varied. From scratch, modern still led every
    # fine-tune there. epoch_count is what filled those 6 minutes: set it to what fills yours, or to "fit"
    # with train-project --time-limit, which plans it from the measured speed.
    "finetune": {
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "learning_rate": 0.001,
        "lr_schedule": "warmup_cosine",
        "warmup_epochs": 1,
        "epoch_count": 50,
        "loss": "asymmetric",
        "trainable_blocks": 2,
    },
}
DEFAULT_RECIPE = "deepdanbooru"
