"""How the WiSE-FT mix is chosen, scored on posts that did not choose it: reads bench/forgetting.py's output.

    python bench/forgetting_choice.py forgetting.json [...]   # where forgetting.py ran: its project paths

The JSON must come from `bench/forgetting.py ... --head-alphas H,... --halves` (every mix keyed 'a/h': the
network at a, the head's rows of the tags the source knew at h; 'a/a' is the plain mix). Per project and per
way of choosing, the mix picked on each half of the validation posts (every other post), with the issue's
figures of that mix on the whole split (known tags lost of those with >= 10 positives / their mean AP rise /
mAP) and its mAP on the *other* half minus the trained weights' there (what the choice gained on posts it
did not see). Criteria: `map` (over every tag with positives: what wise_ft uses), `balanced` (the mean of
the known tags' mAP and the new tags'), `known` (the known tags' mAP alone); families: `plain` (a/a) and
`grid` (every a/h). Last, the bound of any choice: the mixes that meet every goal on the whole split (at
most 10% of the known tags lost, their mean AP up by >= 0.05, mAP not below the trained weights'), chosen
on the very posts that score them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forgetting import goals  # noqa: E402

CRITERIA = ("map", "balanced", "known")


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def score(ap: dict, known: list, new: list, criterion: str) -> float:
    if criterion == "map":
        return mean(ap.values())
    k, n = mean(ap[t] for t in known), mean(ap[t] for t in new)
    return 0.5 * k + 0.5 * n if criterion == "balanced" else k


def pick(keys: list, values: dict) -> str:
    """The best mix; a tie goes to the more trained (as wise_ft breaks it)."""
    return max(keys, key=lambda k: (round(values[k], 6), *(float(x) for x in k.split("/"))))


def figures(g: dict) -> str:
    return f"{g['known_lost']}/{g['known_map_rise']:+.3f}/{g['map']:.3f}"


def report(project: str, result: dict) -> None:
    start = json.loads((Path(project) / "logs" / "source_tag_ap.json").read_text())
    per = result["per_tag_ap"]
    tags = list(per["1/1"])
    known = [t for t in tags if t in start["ap"]]
    new = [t for t in tags if t not in start["ap"]]
    every = [k for k in per if "@" not in k and k != "best"]
    whole = {k: goals(start["ap"], start["support"], per[k], new) for k in every}
    trained = whole["1/1"]
    print(f"{project}: trained weights {figures(trained)} (lost/rise/mAP)")
    for family, keys in (("plain", [k for k in every if len(set(k.split("/"))) == 1]), ("grid", every)):
        for criterion in CRITERIA:
            cells = []
            for half in (0, 1):
                chosen = pick(keys, {k: score(per[f"{k}@half{half}"], known, new, criterion) for k in keys})
                other = f"@half{1 - half}"
                gain = score(per[chosen + other], known, new, "map") - score(per["1/1" + other], known, new, "map")
                cells.append(f"half{half} -> {chosen:7s} {figures(whole[chosen])} other half {gain:+.3f}")
            print(f"  {family:5s} {criterion:8s} " + " | ".join(cells))
    meets = [k for k in every if whole[k]["known_lost_share"] <= 0.1 and whole[k]["known_map_rise"] >= 0.05
             and whole[k]["map"] >= trained["map"] - 1e-9]
    rise = max((k for k in every if whole[k]["map"] >= trained["map"] - 1e-9), key=lambda k: whole[k]["known_map_rise"])
    print(f"  every goal met by {len(meets)} of {len(every)} mixes; the largest rise without losing mAP: "
          f"{rise} {figures(whole[rise])}")


def main(argv=None) -> int:
    for path in (argv if argv is not None else sys.argv[1:]):
        for project, result in json.loads(Path(path).read_text()).items():
            if "per_tag_ap" not in result or not any("@half" in k for k in result["per_tag_ap"]):
                raise SystemExit(f"error: {path}: {project} was measured without --head-alphas and --halves")
            report(project, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
