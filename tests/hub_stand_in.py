"""A local stand-in for the Hugging Face Hub's upload API, enough for `create_repo` and `upload_folder`.

It answers on 127.0.0.1 only, stores every committed file under ``root/<repo_id>/`` and asks clients to send all
files inline ("regular" upload mode), so no LFS or Xet storage is involved.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    root: Path
    log: list

    def log_message(self, *args):  # keep test output clean
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

    def do_GET(self):  # noqa: N802
        self.log.append(("GET", self.path))
        if self.path.startswith("/api/whoami"):
            return self._json(200, {"name": "tester", "type": "user", "auth": {"accessToken": {"role": "write"}}})
        if self.path.startswith("/api/models/"):
            repo = self.path[len("/api/models/") :].split("/revision")[0].split("?")[0]
            if (self.root / repo).is_dir():
                return self._json(200, {"id": repo, "sha": "0" * 40, "siblings": []})
        return self._json(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802
        body = self._body()
        self.log.append(("POST", self.path))
        if self.path == "/api/repos/create":
            info = json.loads(body)
            repo = f"{info['organization']}/{info['name']}" if info.get("organization") else info["name"]
            (self.root / repo).mkdir(parents=True, exist_ok=True)
            return self._json(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
        if self.path.startswith("/api/validate-yaml"):  # model card metadata check
            return self._json(200, {"errors": [], "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(body).get("files", [])
            return self._json(
                200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        if "/commit/" in self.path:
            repo = self.path[len("/api/models/") :].split("/commit/")[0]
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item.get("key") == "file":
                    value = item["value"]
                    target = self.root / repo / value["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(base64.b64decode(value["content"]))
            oid = hashlib.sha1(body).hexdigest()
            return self._json(
                200, {"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{oid}", "commitOid": oid}
            )
        return self._json(404, {"error": f"not handled: {self.path}"})


class HubStandIn:
    """``with HubStandIn(root) as hub:`` then point ``HF_ENDPOINT`` at ``hub.url``."""

    def __init__(self, root: Path):
        handler = type("Handler", (_Handler,), {"root": Path(root), "log": []})
        self.requests = handler.log
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
