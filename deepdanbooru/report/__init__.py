"""`deepdanbooru report PROJECT`: one HTML page of what a run learned (docs/evaluation.md).

Above inference/ and scoring/; it reads nothing of training/ but the files training wrote.

Standard library:
    runfiles.read_run_files(project_dir, model) -> RunFiles (history, best.json, state.json, vocabulary, source AP)
    summary.run_rows(config, files, ...), summary.figure_rows(result), summary.stops(history)
    progress.Bar(label, total): the progress bar
numpy (and Pillow):
    collect.PageCollector(n_tags).update(scores, labels, positions): per picture and per tag, what the page shows
    tables.tag_columns(...), tables.curve_arrays(...), tables.pictures_and_gallery(...): the page's data
    thumbs.write_thumbnail(source, target); page.render(...) -> the HTML text (page.css, page.js inside it)
matplotlib (the `report` extra):
    charts.run_charts(train_rows, validation_rows, stops) -> {name: inline SVG}
TensorFlow:
    score.load_checked(...) -> model; score.score_split(...) -> Scored(metrics, pictures, skipped)
    make.make_report(project_path, model_path=None, output=None) -> ReportWritten
"""
