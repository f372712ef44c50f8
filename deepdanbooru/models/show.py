"""show-model: build a model and report its shapes and parameter counts."""

from __future__ import annotations

import json

from deepdanbooru.models.table import check_model_input


def show_model(name: str, width: int, height: int, n_tags: int, as_json: bool, echo) -> dict:
    input_shape = (height, width, 3)
    # Refuse a bad name or size before paying for the TensorFlow import.
    check_model_input(name, input_shape)
    from deepdanbooru.models.builder import describe_model

    info = describe_model(name, input_shape, n_tags)
    if as_json:
        echo(json.dumps(info, sort_keys=True))
        return info
    total = info["trainable"] + info["non_trainable"]
    echo(f"model:                    {name}")
    echo(f"input shape:              {tuple(info['input_shape'])}")
    echo(f"output shape:             {tuple(info['output_shape'])}")
    echo(f"trainable parameters:     {info['trainable']:,}")
    echo(f"non-trainable parameters: {info['non_trainable']:,}")
    echo(f"total parameters:         {total:,} ({total * 4 / 2**20:,.1f} MiB as float32)")
    echo(f"layers:                   {info['layers']}")
    return info
