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
    # For a --source-model start (an imported tagger, a timm folder, or a tagger of one's own). From the
    # fine-tuning runs of docs/quality.md (emoji, starts pretrained on other emoji, 6 minutes each): from
    # a resnet_small pretrained by train-project it led modern from scratch by 0.06-0.12 mAP; from a small
    # WD-v3-style ViT or a ConvNeXt-atto, modern from scratch led it. 1e-3 beat 3e-4 and 1e-4, a head-only
    # first epoch gained nothing, and more epochs in the same time beat fewer; training only the last 2
    # blocks/stages and the head (trainable_blocks 2) tied or led training every layer, at cheaper steps.
    # Optimizer, weight decay and loss are modern's, not varied. epoch_count is what filled those 6
    # minutes: set it to what fills yours, or to "fit" with train-project --time-limit, which plans it
    # from the measured speed. On a few hundred posts 50 kept the source's tags on 2 of 4 draws of 400
    # posts, "fit" (135-184 epochs on an idle machine) on none (docs/quality.md, "The recipe as it ships");
    # from a second source, run to the end of its schedule, on none of the four; an output-space ensemble with
    # the source, 3e-4 and a frozen trunk kept no more, source_distillation 1 kept more on three draws for
    # 0.011-0.044 less mAP and still missed the goals on three ("Another source, and what 400 posts can give").
    # What the source knew is kept by wise_ft: the last export mixes the trained weights with the start,
    # at the weight of the best validation mAP (docs/quality.md, "Keeping what the source knew": on 400
    # posts it turned 2 of 14 well-measured known tags losing AP into 1 and raised mAP; on 2,661 it chose
    # the trained weights, which had lost none). best_model_metric map, so the best export is chosen by the
    # figure the mix is chosen by and the mixed export can be it. validation_fraction 0.2 leaves a
    # validation positive for most tags of a 1,000-2,000-picture project (make-tags --minimum-post-count
    # 10; docs/finetuning.md), where the default 0.05 left one for a fifth.
    # Left out, measured beside this recipe (docs/quality.md, "Held near the source while it trains"): decay
    # toward the start (weight_decay_toward "start") met the keeping goals at 400 posts no more often at
    # weight_decay 1-3, kept the most known tags at 10 but cost 0.015-0.028 mAP, and cost mAP at 2,672 posts at
    # every strength; known_head_rate 0.1-0.5 scored lower or the same.
    "finetune": {
        "optimizer": "adamw",
        "weight_decay": 0.05,
        "learning_rate": 0.001,
        "lr_schedule": "warmup_cosine",
        "warmup_epochs": 1,
        "epoch_count": 50,
        "loss": "asymmetric",
        "trainable_blocks": 2,
        "wise_ft": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
        "best_model_metric": "map",
        "validation_fraction": 0.2,
    },
}
DEFAULT_RECIPE = "deepdanbooru"
