"""download-tags: general and character tag lists from Danbooru's /tags.json. Standard library only.

The API is paged (limit <= 1000 per page, page = 1, 2, ...) and ordered by post
count, so a category stops at the first tag below --minimum-post-count, at
--limit tags, or at an empty or short page.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from deepdanbooru import __version__
from deepdanbooru.dataset.build import SYSTEM_TAGS
from deepdanbooru.errors import NetworkError, UserError, file_field
from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic
from deepdanbooru.project.categories import CATEGORIES_FILE  # DeepDanbooru's format, read back there
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.trained import check_tags_replaceable, write_tags_file

DEFAULT_BASE_URL = "https://danbooru.donmai.us"
PAGE_SIZE = 1000  # the API's largest page
USER_AGENT = f"deepdanbooru/{__version__} (download-tags; Python urllib)"
# Waiting does not fix these: a wrong host name, nothing listening, an untrusted certificate.
UNREACHABLE = (ConnectionRefusedError, socket.gaierror, ssl.SSLCertVerificationError)


@dataclass(frozen=True)
class Category:
    name: str
    api_id: int  # search[category]
    file_name: str
    title: str  # DeepDanbooru's categories.json name


CATEGORIES = (
    Category("general", 0, "tags-general.txt", "General"),
    Category("character", 4, "tags-character.txt", "Character"),
)
ALL_TAGS_FILE = "tags.txt"
LOG_FILE = "download-tags.log"
OUTPUT_FILES = tuple(c.file_name for c in CATEGORIES) + (ALL_TAGS_FILE, CATEGORIES_FILE, LOG_FILE)
# Danbooru shows the posts of these tags only to paid accounts, so their images cannot be downloaded for
# training; DeepDanbooru's download-tags leaves them out for that reason (--include-paid-tags keeps them).
PAID_TAGS = ("loli", "shota", "toddlercon")


@dataclass
class CategoryResult:
    category: Category
    tags: list[tuple[str, int]] = field(default_factory=list)  # (name, post_count) in API order
    pages: int = 0
    stop_reason: str = ""
    invalid_names: int = 0
    paid_skipped: list[str] = field(default_factory=list)


class TagClient:
    """GET requests to the tag API with authentication, a User-Agent and retries with exponential back-off."""

    def __init__(self, base_url: str, username: str, api_key: str, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 1.0, sleep=time.sleep, notice=print):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"--base-url: {base_url!r} is not an http(s) URL")
        if not username or not api_key:
            raise UserError("--username and --api-key must not be empty")
        self.base_url = base_url.rstrip("/")
        # Basic auth keeps the key out of URLs, which end up in proxies' and servers' logs.
        token = base64.b64encode(f"{username}:{api_key}".encode("utf-8")).decode("ascii")
        self.headers = {"User-Agent": USER_AGENT, "Accept": "application/json", "Authorization": f"Basic {token}"}
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self.notice = notice
        self.requests = 0

    def get_json(self, path: str, params: dict, what: str = ""):
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        where = f"{self.base_url}{path}" + (f" ({what})" if what else "")
        for attempt in range(self.retries + 1):
            self.requests += 1
            try:
                request = urllib.request.Request(url, headers=self.headers)
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                break
            except urllib.error.HTTPError as error:
                with error:
                    retry_after = self._check_status(error, where)
                problem = f"HTTP {error.code} {error.reason}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
                reason = getattr(error, "reason", error)
                problem = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
                if isinstance(reason, UNREACHABLE):
                    raise NetworkError(f"{where}: cannot reach the server: {problem}") from None
                retry_after = None
            if attempt == self.retries:
                raise NetworkError(f"{where}: failed after {attempt + 1} attempts: {problem}")
            delay = retry_after if retry_after is not None else self.backoff * 2 ** attempt
            self.notice(f"{where}: {problem}; retrying in {delay:g} s (attempt {attempt + 2} of {self.retries + 1})")
            self.sleep(delay)
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise NetworkError(f"{where}: the answer is not JSON (starts with {body[:60]!r})") from None

    def _check_status(self, error: urllib.error.HTTPError, where: str) -> float | None:
        """Raise for answers that retrying cannot fix; return the server's Retry-After for the others."""
        code = error.code
        if code == 401:
            raise NetworkError(f"{self.base_url}: authentication failed (HTTP 401): "
                               "check --username and --api-key (an API key, not the password)")
        if code == 403:
            raise NetworkError(f"{self.base_url}: access denied (HTTP 403): the account or API key may lack "
                               "permission for /tags.json, or the server blocks this client")
        if code == 410:
            raise NetworkError(f"{self.base_url}: the server refuses pages this deep (HTTP 410); "
                               "lower --limit or raise --minimum-post-count")
        if code != 429 and code < 500:
            raise NetworkError(f"{where}: HTTP {code} {error.reason}{_error_body(error)}")
        value = error.headers.get("Retry-After") if error.headers else None
        try:
            return min(max(float(value), 0.0), 120.0) if value is not None else None
        except ValueError:
            return None


def _error_body(error: urllib.error.HTTPError) -> str:
    """Danbooru explains a refusal in a small JSON body; show its start."""
    try:
        text = error.read(300).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""
    text = " ".join(text.split())
    return f": {text}" if text else ""


def fetch_category(client: TagClient, category: Category, limit: int, minimum_post_count: int,
                   exclude: frozenset[str] = frozenset()) -> CategoryResult:
    """Page through one category; names in `exclude` are skipped and do not count towards `limit`."""
    result = CategoryResult(category)
    seen: set[str] = set()
    page_size = min(PAGE_SIZE, limit)
    page = 1
    while True:
        params = {"search[category]": category.api_id, "search[order]": "count", "limit": page_size,
                  "page": page, "only": "name,post_count"}
        entries = client.get_json("/tags.json", params, f"{category.name} tags, page {page}")
        result.pages += 1
        if not isinstance(entries, list):
            raise NetworkError(f"{client.base_url}/tags.json: page {page} of {category.name} tags is not a list "
                               f"but {type(entries).__name__}: {str(entries)[:120]}")
        if not entries:
            result.stop_reason = "end of the list"
            return result
        for entry in entries:
            name, count = _entry(entry, client, category, page)
            if count < minimum_post_count:
                result.stop_reason = f"post count {count} of {name!r} below {minimum_post_count}"
                return result
            if not name or any(ch.isspace() for ch in name):
                result.invalid_names += 1
                continue
            # Counts change while we page, so a tag can slide onto the next page too.
            if name in seen:
                continue
            seen.add(name)
            if name in exclude:
                result.paid_skipped.append(name)
                continue
            result.tags.append((name, count))
            if len(result.tags) >= limit:
                result.stop_reason = f"limit of {limit} tags"
                return result
        if len(entries) < page_size:
            result.stop_reason = "end of the list"
            return result
        page += 1


def _entry(entry, client, category, page) -> tuple[str, int]:
    if (not isinstance(entry, dict) or not isinstance(entry.get("name"), str)
            or isinstance(entry.get("post_count"), bool) or not isinstance(entry.get("post_count"), int)):
        raise NetworkError(f"{client.base_url}/tags.json: page {page} of {category.name} tags: "
                           f"unexpected entry {str(entry)[:120]} (want name and post_count)")
    return entry["name"].strip(), entry["post_count"]


def natural_key(tag: str):
    """'tag2' before 'tag10', as DeepDanbooru orders its tag files."""
    return [int(part) if index % 2 else part.lower() for index, part in enumerate(re.split(r"(\d+)", tag))], tag


def download_tags(path, username: str, api_key: str, limit: int = 10000, minimum_post_count: int = 500,
                  overwrite: bool = False, base_url: str = DEFAULT_BASE_URL, echo=print, notice=print,
                  client: TagClient | None = None, include_paid_tags: bool = False,
                  allow_trained: bool = False) -> dict[str, list[str]]:
    """Fetch every category, then write the tag files; nothing is written unless all downloads succeed. In a
    project folder, a tags.txt its checkpoints or exports were trained with is replaced only with allow_trained
    (and kept beside it), as make-tags does."""
    path = Path(path)
    if limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    if minimum_post_count < 0:
        raise UserError(f"--minimum-post-count must be >= 0, got {minimum_post_count}")
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: exists and is not a folder")
    if not overwrite:
        for name in OUTPUT_FILES:
            if (path / name).exists():
                raise UserError(file_field(path / name, None, "already exists; use --overwrite to replace it"))
    project = ProjectPaths(path) if (path / "project.json").is_file() else None
    if project is not None and project.tags.exists():
        check_tags_replaceable(project.tags, project, allow_trained)  # before the downloads, which take minutes
    client = client or TagClient(base_url, username, api_key, notice=notice)
    started = datetime.now(timezone.utc)
    results = []
    exclude = frozenset() if include_paid_tags else frozenset(PAID_TAGS)
    for category in CATEGORIES:
        echo(f"Downloading {category.name} tags from {client.base_url} ...")
        result = fetch_category(client, category, limit, minimum_post_count, exclude)
        echo(f"{len(result.tags)} {category.name} tags ({result.pages} pages; stopped at {result.stop_reason})")
        if result.paid_skipped:
            echo(f"Left out {', '.join(result.paid_skipped)}: their posts are visible to paid accounts only "
                 "(--include-paid-tags keeps them)")
        results.append(result)

    lists: dict[str, list[str]] = {}
    all_tags: list[str] = []
    starts = []
    written: set[str] = set()
    for result in results:
        # A name in two categories would alias two outputs in tags.txt; the first category keeps it.
        names = [name for name in sorted((name for name, _ in result.tags), key=natural_key) if name not in written]
        written.update(names)
        lists[result.category.name] = names
        starts.append({"name": result.category.title, "start_index": len(all_tags)})
        all_tags.extend(names)
    starts.append({"name": "System", "start_index": len(all_tags)})
    all_tags.extend(tag for tag in SYSTEM_TAGS if tag not in written)

    path.mkdir(parents=True, exist_ok=True)
    # tags.txt first: in a project it may still be refused (a run took the project while this downloaded), and
    # then nothing is written; the categories.json that indexes it is kept beside it with the old file.
    content = "".join(f"{t}\n" for t in all_tags)
    if project is None:
        write_text_atomic(path / ALL_TAGS_FILE, content)
    else:
        categories = path / CATEGORIES_FILE
        old_categories = categories.read_bytes() if categories.is_file() else None
        trained, kept = write_tags_file(path / ALL_TAGS_FILE, content, project, allow_trained)
        if kept is not None:
            if old_categories is not None:
                write_bytes_atomic(kept.with_name(kept.stem + ".categories.json"), old_categories)
            echo(f"Kept the previous tags.txt as {kept}: {trained.describe()} were trained with it")
    for result in results:
        write_text_atomic(path / result.category.file_name, "".join(f"{t}\n" for t in lists[result.category.name]))
    write_text_atomic(path / CATEGORIES_FILE, json.dumps(starts, indent=2) + "\n")
    write_text_atomic(path / LOG_FILE, _log_text(started, client, username, limit, minimum_post_count, results,
                                                 len(all_tags), include_paid_tags))
    echo(f"Wrote {len(all_tags)} tags ({len(SYSTEM_TAGS)} rating system tags) to {path / ALL_TAGS_FILE}")
    return lists


def _log_text(started, client, username, limit, minimum_post_count, results, total, include_paid_tags) -> str:
    lines = [
        f"date: {started.isoformat(timespec='seconds')}",
        f"server: {client.base_url}/tags.json",
        f"username: {username}",
        f"limit: {limit}",
        f"minimum_post_count: {minimum_post_count}",
        f"include_paid_tags: {str(include_paid_tags).lower()}",
        f"requests: {client.requests}",
    ]
    for result in results:
        counts = [count for _, count in result.tags]
        span = f", post counts {max(counts)}..{min(counts)}" if counts else ""
        invalid = f", {result.invalid_names} names with whitespace skipped" if result.invalid_names else ""
        if result.paid_skipped:
            invalid += f", left out (paid accounts only): {', '.join(result.paid_skipped)}"
        lines.append(f"{result.category.name} (search[category]={result.category.api_id}): {len(result.tags)} "
                     f"tags in {result.pages} pages{span}; stopped at {result.stop_reason}{invalid}")
    lines.append(f"tags.txt: {total} tags (general, character, then {', '.join(SYSTEM_TAGS)})")
    return "\n".join(lines) + "\n"
