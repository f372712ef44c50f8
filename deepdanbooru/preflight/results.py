"""Check results and how they are shown: one line each, or one JSON object."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from deepdanbooru import exitcodes

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"



@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # PASS, WARN, FAIL, or SKIP when a check it needs failed first
    detail: str
    # Every problem found, where `detail` names the first few and counts the rest (--format json lists them).
    items: tuple[str, ...] = ()


def exit_code(results) -> int:
    return exitcodes.FAILED if any(r.status == FAIL for r in results) else exitcodes.OK


def render_text(results) -> str:
    width = max((len(r.name) for r in results), default=0)
    lines = [f"{r.status}  {r.name:<{width}}  {r.detail}" for r in results]
    failed = [r.name for r in results if r.status == FAIL]
    warned = [r.name for r in results if r.status == WARN]
    if failed:
        lines.append(f"preflight FAILED: {', '.join(failed)}")
    else:
        lines.append("preflight passed" + (f" with warnings: {', '.join(warned)}" if warned else ""))
    return "\n".join(lines)


def render_json(project, results) -> str:
    return json.dumps({
        "project": str(project),
        "ok": exit_code(results) == exitcodes.OK,
        "exit_code": exit_code(results),
        "checks": [{key: value for key, value in asdict(r).items() if key != "items" or value} for r in results],
    }, indent=2)
