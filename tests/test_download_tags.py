import base64
import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset import download
from deepdanbooru.dataset.download import TagClient, download_tags, natural_key
from deepdanbooru.errors import NetworkError
from deepdanbooru.project.tags import load_tags

USER, KEY = "alice", "s3cret-key"


def tag_table():
    general = [{"name": f"general_{i}", "post_count": 5000 - 10 * i, "category": 0} for i in range(120)]
    character = [{"name": f"char_{i}", "post_count": 900 - 100 * i, "category": 4} for i in range(9)]
    return {"0": general, "4": character}


class FakeDanbooru:
    """Imitates /tags.json: paging by limit/page, ordered by post count, basic auth, scripted failures."""

    def __init__(self):
        self.tables = tag_table()
        self.failures = []  # status codes answered, one per request, before normal service
        self.requests = []
        self.hangs = 0  # requests answered only after the client's timeout
        self.retry_after = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake.requests.append((self.path, dict(self.headers)))
                if fake.hangs:
                    fake.hangs -= 1
                    time.sleep(0.6)
                    return
                if fake.failures:
                    code = fake.failures.pop(0)
                    return self.reply(code, {"success": False, "message": f"scripted {code}"})
                url = urllib.parse.urlsplit(self.path)
                expected = "Basic " + base64.b64encode(f"{USER}:{KEY}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    return self.reply(401, {"success": False, "message": "SessionLoader::AuthenticationFailure"})
                if url.path != "/tags.json":
                    return self.reply(404, {"success": False})
                query = dict(urllib.parse.parse_qsl(url.query))
                assert query["search[order]"] == "count"
                rows = sorted(fake.tables.get(query["search[category]"], []), key=lambda t: -t.get("post_count", 0))
                limit, page = int(query["limit"]), int(query["page"])
                assert 1 <= limit <= 1000
                return self.reply(200, rows[(page - 1) * limit: page * limit])

            def reply(self, code, payload):
                body = json.dumps(payload).encode()
                self.send_response(code)
                if code == 429 and fake.retry_after:
                    self.send_header("Retry-After", fake.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)

    def pages(self, category):
        return [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["page"][0]
                for path, _ in self.requests if f"search%5Bcategory%5D={category}" in path]


@pytest.fixture
def server():
    fake = FakeDanbooru()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture(autouse=True)
def no_real_sleep(monkeypatch):
    slept = []
    original = TagClient.__init__

    def init(self, *args, **kwargs):
        kwargs["sleep"] = slept.append
        original(self, *args, **kwargs)

    monkeypatch.setattr(TagClient, "__init__", init)
    return slept


def invoke(server, path, *args, user=USER, key=KEY):
    return CliRunner().invoke(main, ["download-tags", str(path), "--username", user, "--api-key", key,
                                     "--base-url", server.url, *map(str, args)])


def test_pages_until_minimum_post_count(server, tmp_path):
    # general: 5000, 4990, ... -> 4451 tags >= 500 would be 451; with --limit 25 and pages of 10 -> 3 pages.
    result = invoke(server, tmp_path / "tags", "--limit", 25, "--minimum-post-count", 500)
    assert result.exit_code == 0, result.output
    general = load_tags(tmp_path / "tags" / "tags-general.txt")
    assert general == sorted((f"general_{i}" for i in range(25)), key=natural_key)
    assert general[:3] == ["general_0", "general_1", "general_2"] and general[-1] == "general_24"
    # character: 900, 800, ..., 500 are >= 500 -> 5 tags, first page of 9 already holds the one below.
    character = load_tags(tmp_path / "tags" / "tags-character.txt")
    assert character == [f"char_{i}" for i in range(5)]
    assert load_tags(tmp_path / "tags" / "tags.txt") == general + character + [
        "rating:general", "rating:sensitive", "rating:questionable", "rating:explicit"]
    assert server.pages(0) == ["1"] and server.pages(4) == ["1"]  # page size = min(1000, limit)
    categories = json.loads((tmp_path / "tags" / "categories.json").read_text())
    assert categories == [{"name": "General", "start_index": 0}, {"name": "Character", "start_index": 25},
                          {"name": "System", "start_index": 30}]
    log = (tmp_path / "tags" / "download-tags.log").read_text()
    assert f"server: {server.url}/tags.json" in log and "username: alice" in log
    assert "general (search[category]=0): 25 tags in 1 pages, post counts 5000..4760; stopped at limit of 25" in log
    assert "character (search[category]=4): 5 tags in 1 pages, post counts 900..500; stopped at post count 400" \
        in log
    assert KEY not in log and KEY not in result.output
    for path, headers in server.requests:
        assert KEY not in path
        assert headers["User-Agent"].startswith("deepdanbooru/")


def test_paging_over_several_full_pages(server, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "PAGE_SIZE", 7)
    lists = download_tags(tmp_path, USER, KEY, limit=1000, minimum_post_count=4000, base_url=server.url,
                          echo=lambda line: None)
    # general post counts 5000 - 10 i >= 4000 for i <= 100: 101 tags over 15 pages of 7.
    assert len(lists["general"]) == 101
    assert server.pages(0) == [str(page) for page in range(1, 16)]
    assert lists["character"] == []
    assert load_tags(tmp_path / "tags.txt")[-4:] == ["rating:general", "rating:sensitive", "rating:questionable",
                                                     "rating:explicit"]


def test_end_of_list_short_page(server, tmp_path):
    lists = download_tags(tmp_path, USER, KEY, limit=10000, minimum_post_count=0, base_url=server.url,
                          echo=lambda line: None)
    assert len(lists["general"]) == 120 and len(lists["character"]) == 9
    assert server.pages(0) == ["1"]


def test_transient_500_is_retried_with_backoff(server, tmp_path, no_real_sleep):
    server.failures = [500, 503]
    result = invoke(server, tmp_path, "--limit", 3)
    assert result.exit_code == 0, result.output
    assert no_real_sleep == [1.0, 2.0]
    assert (f"warning: {server.url}/tags.json (general tags, page 1): HTTP 500 Internal Server Error; "
            "retrying in 1 s (attempt 2 of 6)") in result.output
    assert load_tags(tmp_path / "tags-general.txt") == ["general_0", "general_1", "general_2"]


def test_timeout_is_retried(server, tmp_path, no_real_sleep):
    server.hangs = 1
    notices = []
    client = TagClient(server.url, USER, KEY, timeout=0.2, notice=notices.append)
    lists = download_tags(tmp_path, USER, KEY, limit=2, client=client, echo=lambda line: None)
    assert lists["general"] == ["general_0", "general_1"]
    assert no_real_sleep == [1.0] and "timed out" in notices[0]
    assert client.requests == 3  # the hung one, its retry, then character


def test_rate_limit_honours_retry_after(server, tmp_path, no_real_sleep):
    server.failures, server.retry_after = [429], "7"
    result = invoke(server, tmp_path, "--limit", 1)
    assert result.exit_code == 0, result.output
    assert no_real_sleep == [7.0]


def test_persistent_500_fails_with_one_line_and_writes_nothing(server, tmp_path, no_real_sleep):
    server.failures = [502] * 6
    result = invoke(server, tmp_path / "out", "--limit", 3)
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last == (f"error: {server.url}/tags.json (general tags, page 1): "
                    "failed after 6 attempts: HTTP 502 Bad Gateway")
    assert no_real_sleep == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert not (tmp_path / "out").exists()


def test_authentication_failure(server, tmp_path):
    result = invoke(server, tmp_path / "out", key="wrong")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: {server.url}: authentication failed (HTTP 401): check --username and --api-key "
        "(an API key, not the password)")
    assert len(server.requests) == 1  # never retried
    assert not (tmp_path / "out").exists()


def test_forbidden_and_other_client_errors(server, tmp_path):
    server.failures = [403]
    result = invoke(server, tmp_path / "out")
    assert result.exit_code == 2 and "access denied (HTTP 403)" in result.output
    server.failures = [422]
    result = invoke(server, tmp_path / "out")
    assert result.exit_code == 2 and "HTTP 422" in result.output and "scripted 422" in result.output
    assert not (tmp_path / "out").exists()


def test_network_failure_is_one_line(tmp_path, no_real_sleep):
    # A port that was free a moment ago: connection refused.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(main, ["download-tags", str(tmp_path / "out"), "--username", USER, "--api-key", KEY,
                                       "--base-url", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: http://127.0.0.1:{port}/tags.json (general tags, page 1): cannot reach "
        "the server: ConnectionRefusedError: [Errno 111] Connection refused")
    assert no_real_sleep == []  # nobody is listening: retrying would not help
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_not_json_answer(tmp_path):
    class Html(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>challenge</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        with pytest.raises(NetworkError, match="the answer is not JSON"):
            download_tags(tmp_path, USER, KEY, base_url=f"http://127.0.0.1:{http.server_address[1]}",
                          echo=lambda line: None)
    finally:
        http.shutdown()
        http.server_close()
    assert list(tmp_path.iterdir()) == []


def test_unexpected_entries_are_refused(server, tmp_path):
    server.tables["0"] = [{"name": "ok", "post_count": 900}, {"title": "no name"}]
    with pytest.raises(NetworkError, match="unexpected entry"):
        download_tags(tmp_path, USER, KEY, base_url=server.url, echo=lambda line: None)


def test_refuses_overwrite_before_any_request(server, tmp_path):
    (tmp_path / "tags.txt").write_text("mine\n")
    result = invoke(server, tmp_path)
    assert result.exit_code == 2
    assert f"error: {tmp_path / 'tags.txt'}: already exists; use --overwrite to replace it" in result.output
    assert server.requests == [] and (tmp_path / "tags.txt").read_text() == "mine\n"
    result = invoke(server, tmp_path, "--overwrite", "--limit", 2)
    assert result.exit_code == 0, result.output
    assert load_tags(tmp_path / "tags.txt")[:2] == ["general_0", "general_1"]


def test_a_project_s_trained_tags_are_replaced_only_when_allowed_and_kept(server, tmp_path):
    """As make-tags: exported models and checkpoints answer in the order of the tags.txt they were trained with."""
    (tmp_path / "project.json").write_text("{}")
    (tmp_path / "tags.txt").write_text("mine\n")
    (tmp_path / "categories.json").write_text('[{"name": "General", "start_index": 0}]\n')
    (tmp_path / "model-resnet_small.keras").write_bytes(b"model")
    result = invoke(server, tmp_path, "--overwrite", "--limit", 2)
    assert result.exit_code == 2 and server.requests == [] and (tmp_path / "tags.txt").read_text() == "mine\n"
    assert result.output.startswith(f"error: {tmp_path / 'tags.txt'}: not replaced: the exported models "
                                    "(model-resnet_small.keras) were trained with it")
    result = invoke(server, tmp_path, "--overwrite", "--allow-trained", "--limit", 2)
    assert result.exit_code == 0, result.output
    assert load_tags(tmp_path / "tags.txt")[:2] == ["general_0", "general_1"]
    (kept,) = tmp_path.glob("tags.replaced-*.txt")
    assert kept.read_text() == "mine\n" and f"Kept the previous tags.txt as {kept}" in result.output
    # The categories.json that indexes the old file is kept with it.
    assert kept.with_name(kept.stem + ".categories.json").read_text() == '[{"name": "General", "start_index": 0}]\n'


def test_bad_options(server, tmp_path):
    assert invoke(server, tmp_path, "--limit", 0).exit_code == 2
    result = CliRunner().invoke(main, ["download-tags", str(tmp_path), "--username", USER, "--api-key", KEY,
                                       "--base-url", "ftp://example"])
    assert result.exit_code == 2 and "is not an http(s) URL" in result.output
    result = CliRunner().invoke(main, ["download-tags", str(tmp_path), "--username", USER],
                                env={"DANBOORU_API_KEY": None})
    assert result.exit_code == 2 and "--api-key" in result.output
    assert server.requests == []


def test_api_key_from_environment(server, tmp_path):
    result = CliRunner().invoke(main, ["download-tags", str(tmp_path), "--limit", 1, "--base-url", server.url],
                                env={"DANBOORU_USERNAME": USER, "DANBOORU_API_KEY": KEY})
    assert result.exit_code == 0, result.output
    assert load_tags(tmp_path / "tags-general.txt") == ["general_0"]


def test_natural_key():
    assert sorted(["tag10", "tag2", "Tag1", "a"], key=natural_key) == ["a", "Tag1", "tag2", "tag10"]


def test_paid_only_tags_are_left_out_unless_asked(server, tmp_path):
    general = server.tables["0"]
    general[1]["name"], general[3]["name"], general[5]["name"] = "loli", "shota", "toddlercon"
    result = invoke(server, tmp_path / "default", "--limit", 10)
    assert result.exit_code == 0, result.output
    kept = load_tags(tmp_path / "default" / "tags-general.txt")
    assert len(kept) == 10 and not {"loli", "shota", "toddlercon"} & set(kept)
    assert "general_10" in kept and "general_12" in kept  # --limit counts the kept tags only
    assert "Left out loli, shota, toddlercon" in result.output
    assert "left out (paid accounts only): loli, shota, toddlercon" in (
        tmp_path / "default" / "download-tags.log").read_text()

    result = invoke(server, tmp_path / "all", "--limit", 10, "--include-paid-tags")
    assert result.exit_code == 0, result.output
    kept = load_tags(tmp_path / "all" / "tags-general.txt")
    assert {"loli", "shota", "toddlercon"} <= set(kept) and len(kept) == 10
    assert "include_paid_tags: true" in (tmp_path / "all" / "download-tags.log").read_text()
