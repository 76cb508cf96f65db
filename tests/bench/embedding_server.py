"""An OpenAI-compatible `POST /v1/embeddings` on 127.0.0.1 for `make bench-memory`: WordLlama's
`l2_supercat` model (256 dimensions), whose weights and tokenizer ship inside its wheel, loaded
with downloads off (nothing leaves the machine).

Standard library and wordllama only: it runs under a Python of its own (`.venv/embed`, made by
`make bench-memory`), so numpy and the tokenizers stay out of the project's environment. It prints
`PORT <n>` once listening, and serves until its standard input closes (its parent is gone).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "wordllama-l2_supercat-256"
MAX_BODY = 4 * 1024 * 1024


def _load() -> Any:
    import wordllama

    # The wheel ships the tokenizer under wordllama/tokenizers/, where WordLlama looks only in
    # its cache folder: naming the package folder as the cache finds it without a download.
    folder = Path(wordllama.__file__).parent
    return wordllama.WordLlama.load(cache_dir=folder, disable_download=True)


def main() -> None:
    model = _load()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("content-length", 0))
            if self.path.split("?")[0] != "/v1/embeddings" or not 0 < size <= MAX_BODY:
                self.send_error(404 if size else 400)
                return
            body = json.loads(self.rfile.read(size))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            with lock:
                vectors = model.embed([str(t) for t in texts], norm=True)
            tokens = sum(len(str(t).split()) for t in texts)
            payload = json.dumps(
                {
                    "object": "list",
                    "model": MODEL,
                    "data": [
                        {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                        for i, v in enumerate(vectors)
                    ],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"PORT {server.server_address[1]}", flush=True)
    sys.stdin.read()  # until the parent closes it, or dies
    server.shutdown()


if __name__ == "__main__":
    main()
