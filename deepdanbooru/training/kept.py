"""The closing "Kept from the source" line of a run that measured its source (scoring.kept has the figures)."""

from __future__ import annotations

import json
from pathlib import Path

from deepdanbooru.scoring.kept import kept_line, kept_on
from deepdanbooru.training.monitors import Monitor
from deepdanbooru.training.start import SOURCE_AP_FILE


class KeptMonitor(Monitor):
    """After the final figures (and a --time-limit stop's): the kept line of a run that measured its source."""

    def __init__(self, logs: Path, tags, echo=print):
        self.path = Path(logs) / SOURCE_AP_FILE
        self.tags = list(tags)
        self.echo = echo
        self._last = None

    def on_validation(self, report, logs):
        self._last = report

    def on_train_end(self, progress):
        self._say()

    def on_train_stopped(self, progress):
        self._say()

    def _say(self):
        if self._last is None or not self.path.is_file():
            return
        try:
            start = json.loads(self.path.read_text(encoding="utf-8"))
            source_ap = dict(start["ap"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # the figures are a courtesy; a damaged file is reported by evaluate-project and the report
        if start.get("validation_records") != self._last.records:
            return  # the split changed since the source was measured: other posts, no comparison
        self.echo(kept_line(kept_on(source_ap, self.tags, self._last.result["per_tag"])))
