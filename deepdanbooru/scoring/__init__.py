"""Turning a model's scores into figures; shared by the trainer's validation and by inference.

    split.split_records(records, validation_fraction, seed) -> (training, validation)   numpy
    metrics.ValidationMetrics(n_tags, threshold).update(scores, labels, loss_sum).result() numpy
    thresholds: threshold search and the *.thresholds.csv file                          numpy
    scorer.BatchScorer(model, loss, height, width), scorer.measure(scorer, dataset, threshold)  TensorFlow
"""
