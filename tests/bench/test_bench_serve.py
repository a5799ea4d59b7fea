"""lab.bench.serve: exact metrics on hand-made records, and end-to-end runs against a tiny fake
OpenAI-compatible SSE server (stdlib, in a thread) that counts its concurrent requests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lab.bench.serve import (
    DEFAULT_VOCAB,
    RequestRecord,
    arrival_gaps,
    cli,
    format_table,
    main,
    parse_goodput,
    random_dataset,
    random_vocab_size,
    summarize,
)

# ----------------------------------------------------------------------------- summarize


def test_summarize_exact_numbers():
    recs = [
        # ttft 0.1, e2e 0.5, 5 tokens -> tpot 0.1
        RequestRecord(True, 10, 5, 0.1, 0.5, [0.1, 0.1, 0.1, 0.1]),
        # ttft 0.3, e2e 0.9, 3 tokens -> tpot 0.3
        RequestRecord(True, 20, 3, 0.3, 0.9, [0.2, 0.4]),
        # one token: no tpot, no itl
        RequestRecord(True, 30, 1, 0.2, 0.2, []),
        RequestRecord(False, 40, 0, 0.0, 0.0, [], error="HTTP 500"),
    ]
    s = summarize(recs, 2.0, percentiles=(50, 99))
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 60 and s["total_output_tokens"] == 9
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(4.5)
    assert s["total_token_throughput"] == pytest.approx(34.5)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(200 + 0.98 * 100)  # linear interpolation
    assert s["mean_tpot_ms"] == pytest.approx(200.0)
    assert s["median_tpot_ms"] == pytest.approx(200.0)
    assert s["p99_tpot_ms"] == pytest.approx(100 + 0.99 * 200)
    # itl: [100]*4 + [200, 400]
    assert s["mean_itl_ms"] == pytest.approx(1000 / 6)
    assert s["median_itl_ms"] == pytest.approx(100.0)
    assert s["p50_itl_ms"] == pytest.approx(100.0)
    assert s["mean_e2el_ms"] == pytest.approx(1600 / 3)
    assert s["median_e2el_ms"] == pytest.approx(500.0)
    assert "request_goodput" not in s

    g = summarize(recs, 2.0, goodput={"ttft": 250, "tpot": 150})
    # rec0: ttft 100, tpot 100 ok; rec1: ttft 300 no; rec2: ttft 200, tpot n/a ok
    assert g["good_requests"] == 2 and g["request_goodput"] == pytest.approx(1.0)
    g = summarize(recs, 2.0, goodput={"e2el": 500})
    assert g["good_requests"] == 2
    table = format_table(g)
    for label in ("Successful requests:", "Request goodput", "Mean TTFT (ms):", "P99 ITL (ms):",
                  "Median TPOT (ms):", "Mean E2EL (ms):"):
        assert label in table


def test_summarize_empty_and_goodput_parse():
    s = summarize([RequestRecord(error="x")], 1.0)
    assert s["completed"] == 0 and s["failed"] == 1 and s["mean_ttft_ms"] == 0.0
    assert parse_goodput(["ttft:200", "TPOT:50.5"]) == {"ttft": 200.0, "tpot": 50.5}
    assert parse_goodput(None) is None
    with pytest.raises(ValueError):
        parse_goodput(["latency:3"])


def test_random_dataset_and_gaps():
    a = random_dataset(20, 32, 8, 0.25, 100, seed=3)
    assert a == random_dataset(20, 32, 8, 0.25, 100, seed=3)
    assert all(24 <= len(r.prompt) <= 40 and r.prompt_len == len(r.prompt) for r in a)
    assert all(6 <= r.output_len <= 10 for r in a)
    assert all(0 <= t < 100 for r in a for t in r.prompt)
    assert len({len(r.prompt) for r in a}) > 1
    assert all(len(r.prompt) == 32 for r in random_dataset(5, 32, 8, 0.0, 100, 0))
    assert arrival_gaps(4, float("inf"), 1.0, 0) == [0.0] * 4
    g = arrival_gaps(4000, 10.0, 1.0, 0)
    assert sum(g) / len(g) == pytest.approx(0.1, rel=0.1)
    g = arrival_gaps(4000, 10.0, 0.5, 0)  # burstier: same mean
    assert sum(g) / len(g) == pytest.approx(0.1, rel=0.1)


# ----------------------------------------------------------------------------- fake server


class FakeServer:
    """Streams max_tokens chunks of one-word text, `delay` s apart, then usage and [DONE].
    A prompt "FAIL" gets HTTP 500; "BREAK" gets an error event mid-stream; "EMPTY" gets chunks 0
    and 2 with empty text (a token that ends inside a UTF-8 character)."""

    def __init__(self, delay: float = 0.005, first_delay: float = 0.02, root: str | None = None):
        self.root = root  # what GET /v1/models names as the model's root (None: no /v1/models)
        self.active = 0
        self.max_active = 0
        self.requests = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if fake.root is None or self.path != "/v1/models":
                    self.send_error(404)
                    return
                body = json.dumps({"data": [{"id": "fake", "root": fake.root}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests += 1
                    fake.active += 1
                    fake.max_active = max(fake.max_active, fake.active)
                self.counted = True
                try:
                    self._serve(body)
                finally:
                    self._leave()

            def _leave(self):
                # leave the count before the last bytes go out: a client that has read them may
                # send its next request before this thread runs again
                with fake.lock:
                    if self.counted:
                        fake.active -= 1
                        self.counted = False

            def _last(self, data: bytes):
                self._leave()
                self.wfile.write(data)
                self.wfile.flush()

            def _serve(self, body):
                prompt = body["prompt"]
                if prompt == "FAIL":
                    time.sleep(first_delay)
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self._last(b'{"error": "boom"}')
                    return
                assert body["stream"] and body["stream_options"]["include_usage"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                n = int(body["max_tokens"])
                time.sleep(first_delay)

                def send(obj, last=False):
                    data = f"data: {json.dumps(obj)}\n\n".encode()
                    if last:
                        self._last(data)
                        return
                    self.wfile.write(data)
                    self.wfile.flush()

                for i in range(n):
                    if i:
                        time.sleep(delay)
                    if prompt == "BREAK" and i == 1:
                        send({"error": {"message": "engine died"}}, last=True)
                        return
                    text = "" if prompt == "EMPTY" and i in (0, 2) else f" w{i}"
                    send({"choices": [{"index": 0, "text": text, "finish_reason": None}],
                          "usage": None})
                plen = len(prompt) if isinstance(prompt, list) else len(prompt.split())
                send({"choices": [], "usage": {"prompt_tokens": plen, "completion_tokens": n,
                                               "total_tokens": plen + n}})
                self._last(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run(url, *extra):
    return main(["--base-url", url, "--model", "fake", "--vocab-size", "50", "--seed", "1",
                 *extra])


def test_end_to_end_random_inf(tmp_path, capsys):
    out = tmp_path / "r.json"
    with FakeServer() as srv:
        s = run(srv.url, "--num-prompts", "8", "--request-rate", "inf", "--input-len", "12",
                "--output-len", "6", "--ignore-eos", "--goodput", "ttft:5000",
                "--result-json", str(out))
    assert srv.requests == 8
    assert s["completed"] == 8 and s["failed"] == 0
    assert s["total_output_tokens"] == 48 and s["total_input_tokens"] == 96
    assert 0 < s["mean_ttft_ms"] < s["mean_e2el_ms"]
    assert s["good_requests"] == 8
    assert srv.max_active > 2  # all at once
    r = json.loads(out.read_text())
    assert len(r["ttfts"]) == 8 and all(len(x) == 5 for x in r["itls"])
    assert all(t < e for t, e in zip(r["ttfts"], r["e2els"]))
    assert r["completed"] == 8 and r["config"]["request_rate"] == "inf"
    assert "Serving Benchmark Result" in capsys.readouterr().out


def test_max_concurrency_respected():
    with FakeServer() as srv:
        s = run(srv.url, "--num-prompts", "8", "--input-len", "4", "--output-len", "4",
                "--max-concurrency", "2")
    assert s["completed"] == 8
    assert srv.max_active == 2


def test_finite_rate_spreads_arrivals(tmp_path):
    out = tmp_path / "r.json"
    n, rate = 6, 25.0
    with FakeServer() as srv:
        s = run(srv.url, "--num-prompts", str(n), "--request-rate", str(rate), "--input-len",
                "4", "--output-len", "2", "--result-json", str(out))
    assert s["completed"] == n
    starts = json.loads(out.read_text())["starts"]
    expected = arrival_gaps(n, rate, 1.0, 1)
    # each request starts no earlier than the sum of its gaps
    acc = 0.0
    for st, g in zip(starts, expected):
        acc += g
        assert st >= acc - 1e-3
    assert s["duration"] >= sum(expected)
    assert starts[-1] - starts[0] > 0.05


def test_errors_are_counted_not_fatal(tmp_path):
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"prompt": "hello there", "output_len": 3},
                                {"prompt": "FAIL", "output_len": 3},
                                {"prompt": "BREAK", "output_len": 3},
                                {"prompt": "one two three", "output_len": 4}]))
    out = tmp_path / "r.json"
    with FakeServer() as srv:
        s = run(srv.url, "--num-prompts", "4", "--dataset", "sharegpt-like-json",
                "--dataset-path", str(data), "--result-json", str(out))
    assert s["completed"] == 2 and s["failed"] == 2
    assert s["total_output_tokens"] == 7 and s["total_input_tokens"] == 5  # from usage
    r = json.loads(out.read_text())
    assert r["successes"] == [True, False, False, True]
    assert r["errors"][1].startswith("HTTP 500") and "engine died" in r["errors"][2]


def test_unreachable_server_counts_failures():
    with FakeServer() as srv:
        url = srv.url
    s = run(url, "--num-prompts", "2", "--input-len", "4", "--output-len", "2",
            "--timeout", "2")
    assert s["completed"] == 0 and s["failed"] == 2


def test_random_ids_come_from_the_servers_checkpoint(tmp_path):
    """Without --vocab-size or --tokenizer the ids are drawn below the vocabulary of the
    checkpoint /v1/models names (the README's command drew below 1000 against tiny_llama's 512:
    64 of 64 requests failed); a server that names none gets the default."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 37}))
    with FakeServer(root=str(tmp_path)) as srv:
        assert random_vocab_size(None, None, srv.url) == 37
        assert random_vocab_size(None, 50, srv.url) == 50  # said on the command line
    with FakeServer() as srv:
        assert random_vocab_size(None, None, srv.url) == DEFAULT_VOCAB


def test_the_command_exits_1_when_a_request_failed():
    """`lab bench serve` (cli) exits 0 only when every request succeeded: a run whose requests
    all failed used to exit 0 after printing its table."""
    with FakeServer() as srv:
        args = ["--base-url", srv.url, "--model", "fake", "--vocab-size", "50",
                "--num-prompts", "2", "--input-len", "4", "--output-len", "2"]
        assert cli(args) == 0
        url = srv.url
    assert cli(["--base-url", url, "--model", "fake", "--vocab-size", "50", "--num-prompts",
                "2", "--input-len", "4", "--output-len", "2", "--timeout", "2"]) == 1


def test_empty_text_chunks(tmp_path):
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"prompt": "EMPTY", "output_len": 5}]))
    rs = {}
    with FakeServer() as srv:
        for flag in ([], ["--text-chunks-only"]):
            out = tmp_path / f"r{len(flag)}.json"
            run(srv.url, "--num-prompts", "1", "--dataset", "sharegpt-like-json",
                "--dataset-path", str(data), "--result-json", str(out), *flag)
            rs[len(flag)] = json.loads(out.read_text())
    every, text = rs[0], rs[1]
    assert len(every["itls"][0]) == 4 and len(text["itls"][0]) == 2  # 5 chunks vs 3 with text
    assert every["output_lens"] == text["output_lens"] == [5]  # from usage either way
    for r in (every, text):
        assert sum(r["itls"][0]) == pytest.approx(r["e2els"][0] - r["ttfts"][0])
    # text-only waits for chunk 1, sent first_delay (0.02) + delay (0.005) after the request
    assert every["ttfts"][0] >= 0.02 and text["ttfts"][0] >= 0.025
