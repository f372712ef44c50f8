"""Using a trained model: evaluate, evaluate-project, grad-cam, conv2tflite, export-bundle (docs/evaluation.md).

Standard library (importable without TensorFlow, checked before it loads):
    targets.collect_targets(targets, allow_folder, folder_filters) -> [Path] in natural order
    targets.natural_key(text), targets.sidecar_path(image, extension) -> image.txt
    caption_files.existing_captions(images, CaptionOptions(...)), caption_files.caption_text(tags, existing)
    model_files.resolve_model_files(project_path, model_path, tags_path) -> ModelFiles(model, tags, config)
    model_files.resolve_model_source(project_path, model_path) -> (Path, what it is)
    names.safe_file_name(name), names.UniqueNames()
    bundle_rows.plan_rows(tags, categories) -> BundleRows: WD's four ratings, then general, then character
numpy (and Pillow):
    toolfeed.tool_picture(path, size): a picture as the WD tagger tools feed it (BGR 0-255, white square)
    output.threshold_vector(tags, threshold, thresholds_csv), output.set_category_thresholds(...),
    output.drop_undesired(vector, tags, undesired), output.select_tags(tags, scores, thresholds, by_score),
    output.make_writer("text" | "json" | "csv", echo)
TensorFlow:
    predict.configure_devices(allow_gpu), predict.load_tagger(files, tags, alpha=None) -> Tagger
        Tagger.predict(paths, batch_size, on_skip) -> (index, scores); Tagger.images(paths, on_skip)
    evaluate.evaluate(targets, TaggingOptions(...), project_path=...) -> EvaluationSummary(model, tagged, skipped)
    gradcam.Explainer(model).explain(image, tag_indices) -> [TagMaps]; gradcam.grad_cam_command(...)
    convert.convert_model(model, save_path, ...) -> ConversionReport; convert.conv2tflite(...)
    bundle.export_bundle(project_path, directory, size=448, ...) -> BundleReport (measured by bundle_measure)
"""
