"""bench/forgetting_choice.py: the mix chosen on one half of the validation posts, scored on the other."""

import json

import pytest

from bench_modules import load_bench


def load():
    return load_bench("forgetting_choice")


def test_criteria_and_ties():
    module = load()
    ap = {"old": 0.8, "old2": 0.4, "new": 0.2, "absent": None}
    assert module.score(ap, ["old", "old2"], ["new"], "map") == pytest.approx((0.8 + 0.4 + 0.2) / 3)
    assert module.score(ap, ["old", "old2"], ["new"], "known") == pytest.approx(0.6)
    assert module.score(ap, ["old", "old2"], ["new"], "balanced") == pytest.approx(0.4)
    # A tie goes to the more trained mix, as wise_ft breaks it.
    assert module.pick(["0.8/0.8", "1/1", "0.9/1"], {"0.8/0.8": 0.5, "1/1": 0.5, "0.9/1": 0.4}) == "1/1"


def test_report_picks_on_one_half_and_scores_on_the_other(tmp_path, capsys):
    project = tmp_path / "run"
    (project / "logs").mkdir(parents=True)
    # One known tag with 10 positives (AP 0.5 from the source), one new tag.
    (project / "logs" / "source_tag_ap.json").write_text(json.dumps({"ap": {"old": 0.5}, "support": {"old": 10}}))
    per = {"1/1": {"old": 0.52, "new": 0.6}, "0.5/0.5": {"old": 0.6, "new": 0.5},
           "1/1@half0": {"old": 0.5, "new": 0.6}, "1/1@half1": {"old": 0.5, "new": 0.6},
           "0.5/0.5@half0": {"old": 0.7, "new": 0.5}, "0.5/0.5@half1": {"old": 0.4, "new": 0.5}}
    out = tmp_path / "forgetting.json"
    out.write_text(json.dumps({str(project): {"per_tag_ap": per}}))
    assert load().main([str(out)]) == 0
    printed = capsys.readouterr().out
    assert "trained weights 0/+0.020/0.560" in printed
    # Half 0 prefers the mix (0.6 > 0.55); on half 1 it scores 0.45 against the trained 0.55.
    assert "half0 -> 0.5/0.5 0/+0.100/0.550 other half -0.100" in printed
    assert "half1 -> 1/1     0/+0.020/0.560 other half +0.000" in printed
    # Both mixes keep the known tag and raise it; only 0.5/0.5 rises by 0.05 but it loses mAP.
    assert "every goal met by 0 of 2 mixes" in printed


def test_refuses_a_file_measured_without_halves(tmp_path):
    out = tmp_path / "forgetting.json"
    out.write_text(json.dumps({"run": {"per_tag_ap": {"1/1": {"old": 0.5}}}}))
    with pytest.raises(SystemExit, match="without --head-alphas and --halves"):
        load().main([str(out)])
