"""A minimal OpenAI-compatible chat-completions server over a local Hugging Face model.

For a local judge (GCD's external labels, the correction summariser) and for tests: POST
/v1/chat/completions with {model, messages, n, temperature, top_p, max_tokens} returns `n`
choices. Streaming (`stream: true`) is refused with 400 and the reason, never answered with a
reply a streaming client cannot read. Requests are served one at a time (generation holds a
lock); this is not a production server.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from agentrl.config import SamplingConfig
from agentrl.sampler.hf import HFSampler


def make_server(model, tokenizer, host: str = "127.0.0.1", port: int = 0, name: str = "agentrl") -> ThreadingHTTPServer:
    """A server bound to (host, port); port 0 picks a free one (see `server.server_port`). GET
    /v1/models lists the one model as `name` (clients probe it before chatting)."""
    sampler, lock = HFSampler(model, tokenizer), threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.rstrip("/") not in ("/v1/models", "/models"):
                return self._reply(404, {"error": {"message": f"no route {self.path}"}})
            self._reply(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "agentrl"}]})

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._reply(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if body.get("stream"):
                    raise ValueError("stream=true is not supported by agentrl serve; ask without streaming")
                messages, n = body["messages"], int(body.get("n", 1))
                params = SamplingConfig(temperature=float(body.get("temperature", 1.0)),
                                        top_p=float(body.get("top_p", 1.0)),
                                        max_new_tokens=int(body.get("max_tokens", 256)))
            except (ValueError, KeyError, TypeError) as error:
                return self._reply(400, {"error": {"message": f"bad request: {error}"}})
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(ids, add_special_tokens=False).input_ids
            with lock, torch.no_grad():
                generations = sampler.generate([ids] * n, params)
            choices = [{"index": i, "finish_reason": "stop", "message": {
                "role": "assistant", "content": tokenizer.decode(g.token_ids, skip_special_tokens=True)}}
                for i, g in enumerate(generations)]
            self._reply(200, {"object": "chat.completion", "model": body.get("model", ""), "choices": choices})

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # keep request lines (and any headers) out of logs
            pass

    return ThreadingHTTPServer((host, port), Handler)
