"""A WebSocket echo server for a box (ws_app.py): the standard library's http.server, with the SDK's
framing (levers9.runner.ws_frames, itself standard library only, on every container's PYTHONPATH).
It answers each message with "box:" before it and logs how the client closed."""
import http.server
import sys

from levers9.runner import ws_frames as F


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if not F.wants_upgrade("GET", self.headers.get("Upgrade", ""), self.headers.get("Connection", "")):
            self.send_response(426)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", F.accept_key(self.headers["Sec-WebSocket-Key"]))
        self.end_headers()
        self.close_connection = True
        while True:
            op, payload = F.read_message(self.rfile, 1 << 20, lambda op, p: bool(self.wfile.write(F.encode(F.PONG, p))))
            if op == F.CLOSE:
                self.wfile.write(F.encode(F.CLOSE, payload[:2]))
                print(f"box: the client closed with {F.parse_close(payload)[0]}", flush=True)
                return
            self.wfile.write(F.encode(op, b"box:" + payload))


http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
