"""Importing timm checkpoints (Hugging Face layout; WD v3 taggers) as ordinary Keras models.

    checkpoint.import_checkpoint(folder, channel_order=None) -> ImportedModel   the whole tagger, head included
    write.import_model(source, save_path, ...)          import-model: FILE.keras, FILE.tags.txt, FILE.categories.json
    trunk.load_trunk(model, name, folder, channel_order=None)   backbone_weights: a registry model's trunk
    source.read_source(folder, channel_order=None)      config.json and selected_tags.csv (standard library)
    source.is_checkpoint_folder(path)                   a folder with config.json (standard library)

Per family (vit.py, convnext.py, swinv2.py): options from (architecture, model_args), a builder of built-in Keras
layers, and the table of checkpoint tensors -> layer weights.
"""
