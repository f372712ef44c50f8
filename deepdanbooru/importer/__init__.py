"""Importing timm checkpoints (Hugging Face layout; WD v3 taggers) as ordinary Keras models.

    import_checkpoint(folder, channel_order=None) -> ImportedModel   the whole tagger, head included
    write_imported(imported, path)                                    FILE.keras + its tags beside it
    load_trunk(model, name, folder, input_shape, channel_order=None)  a registry model's trunk (backbone_weights)
"""
