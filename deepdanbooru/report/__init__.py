"""`deepdanbooru report PROJECT`: one HTML page of what a run learned (docs/evaluation.md).

Above inference/ and scoring/; it reads nothing of training/ but the files training wrote.

Standard library:
    runfiles.read_run_files(config, paths) -> RunFiles (history, best.json, state.json, vocabulary, source AP)
    summary.run_summary(config, files, ...) -> the run's rows; summary.figure_coverage(result)
numpy:
    collect.PageCollector: per picture and per tag, what the page shows, fed batch by batch
    tables.tag_rows(...), tables.picture_rows(...): the page's data
matplotlib (the `report` extra):
    charts.run_charts(history) -> {name: inline SVG}
TensorFlow:
    score.score_split(...) -> (ValidationMetrics, PageCollector)
    make.make_report(project_path, model_path=None, output=None) -> ReportWritten
"""
