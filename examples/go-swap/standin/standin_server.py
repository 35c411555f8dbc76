#!/usr/bin/env python3
"""A stand-in for llama-server where none can run (no GPU): the same HTTP
endpoints and answer shapes, with a "model" whose weights and KV cache live
in CUDA memory through standin_model.c (loaded with ctypes, linked against a
CUDA runtime; under `vmmw exec` the interposer serves its cudaMalloc).

    standin_server.py --model NAME --port N [--host H] [--ctx-size N]
        [--weights-mb N] [--token-delay-ms N] [--lib PATH] [--sleep-idle-seconds N]

Output is deterministic: it depends on the model's name (the weights' seed),
the weights' bytes and the cached prompt state (see standin_model.c), so a
sleep that loses bytes gives a different answer, and a lost KV cache shows
as a large timings.prompt_n. Standard library only.
"""

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 4096
SYLLABLES = [c + v for c in "bdfghjklmnprstvz" for v in "aeio"]


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def tokenize(text: str):
    return [fnv1a(w.encode()) % VOCAB for w in text.split()]


def detokenize(tok: int) -> str:
    return " " + SYLLABLES[tok % 64] + SYLLABLES[(tok // 64) % 64]


class ModelError(Exception):
    def __init__(self, code, what):
        super().__init__(f"{what}: error {code}")
        self.code = code


class Model:
    """The C model; one request at a time (llama-server with one slot)."""

    def __init__(self, lib_path, name, weight_bytes, ctx):
        # RTLD_GLOBAL, as PyTorch loads its CUDA libraries: the runtime the
        # model links joins the global scope, where the interposer finds the
        # functions it forwards to.
        self.lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)
        self.lib.sm_load.argtypes = [ctypes.c_uint64] * 3
        self.lib.sm_prompt.argtypes = [ctypes.POINTER(ctypes.c_int32), ctypes.c_uint64,
                                       ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
        self.lib.sm_next.argtypes = [ctypes.POINTER(ctypes.c_int32)]
        self.lib.sm_device_bytes.restype = ctypes.c_uint64
        self.lock = threading.Lock()
        self.ctx = ctx
        self.weight_bytes, self.seed = weight_bytes, fnv1a(name.encode())
        self.asleep = False
        self.last_used = time.monotonic()
        self.load()

    def load(self):
        rc = self.lib.sm_load(self.weight_bytes, self.ctx, self.seed)
        if rc != 0:
            raise ModelError(rc, "loading the weights")

    def sleep_if_idle(self, idle):
        """llama-server's --sleep-idle-seconds: the model freed after `idle`
        seconds without a request, loaded again (its KV cache lost) by the next."""
        with self.lock:
            if not self.asleep and time.monotonic() - self.last_used >= idle:
                self.lib.sm_unload()
                self.asleep = True
                print(f"sleeping after {idle} s idle", flush=True)

    def prompt(self, tokens, cache=True):
        """Under self.lock."""
        self.last_used = time.monotonic()
        if self.asleep:
            self.load()
            self.asleep = False
        if not cache:
            self.lib.sm_forget_cache()
        arr = (ctypes.c_int32 * len(tokens))(*tokens)
        pn, cn = ctypes.c_uint64(), ctypes.c_uint64()
        rc = self.lib.sm_prompt(arr, len(tokens), ctypes.byref(pn), ctypes.byref(cn))
        if rc == -2:
            raise ModelError(rc, f"the prompt has {len(tokens)} tokens, over the context of {self.ctx}")
        if rc != 0:
            raise ModelError(rc, "evaluating the prompt")
        return pn.value, cn.value

    def next(self):
        t = ctypes.c_int32()
        rc = self.lib.sm_next(ctypes.byref(t))
        if rc != 0:
            raise ModelError(rc, "generating")
        return t.value


def chat_prompt(messages):
    parts = []
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role', 'user')}|> {content}")
    return " ".join(parts) + " <|assistant|>"


def make_handler(model, name, token_delay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def send_json(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error(self, code, message, kind="invalid_request_error"):
            self.send_json(code, {"error": {"code": code, "message": message, "type": kind}})

        def do_GET(self):
            if self.path == "/health":
                self.send_json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "llamacpp"}]})
            elif self.path == "/props":
                self.send_json(200, {"model_path": name, "n_ctx": model.ctx,
                                     "device_bytes": model.lib.sm_device_bytes(), "pid": os.getpid(),
                                     "is_sleeping": model.asleep})
            else:
                self.error(404, f"no endpoint {self.path}", "not_found_error")

        def do_POST(self):
            try:
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
            except (ValueError, json.JSONDecodeError) as e:
                self.error(400, f"bad JSON: {e}")
                return
            if self.path == "/v1/chat/completions":
                if not isinstance(req.get("messages"), list):
                    self.error(400, "'messages' is required")
                    return
                self.complete(req, chat_prompt(req["messages"]), chat=True)
            elif self.path in ("/v1/completions", "/completion", "/completions"):
                prompt = req.get("prompt")
                if isinstance(prompt, list):
                    prompt = " ".join(str(p) for p in prompt)
                if not isinstance(prompt, str) or not prompt.strip():
                    self.error(400, "'prompt' is required")
                    return
                self.complete(req, prompt, chat=False, native=self.path == "/completion")
            else:
                self.error(404, f"no endpoint {self.path}", "not_found_error")

        def complete(self, req, text, chat, native=False):
            n_predict = int(req.get("max_tokens") or req.get("n_predict") or 16)
            stream = bool(req.get("stream"))
            # llama-server's defaults: the prompt cache on, no token ids in the answer.
            cache = req.get("cache_prompt", True) is not False
            return_tokens = bool(req.get("return_tokens"))
            tokens = tokenize(text)
            created = int(time.time())
            cid = f"{'chatcmpl' if chat else 'cmpl'}-{fnv1a(text.encode()) % 10**12}"
            with model.lock:
                t0 = time.monotonic()
                try:
                    prompt_n, cache_n = model.prompt(tokens, cache)
                except ModelError as e:
                    self.error(400 if e.code == -2 else 500, str(e), "server_error")
                    return
                t1 = time.monotonic()
                if stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                out, ids = [], []
                try:
                    for i in range(n_predict):
                        tok = model.next()
                        piece = detokenize(tok)
                        out.append(piece)
                        ids.append(tok)
                        if stream and native:
                            # llama-server's own /completion stream: content pieces, stop last.
                            self.event({"content": piece, "stop": False,
                                        **({"tokens": [tok]} if return_tokens else {})})
                        elif stream:
                            if i == 0 and chat:
                                self.event(self.chunk(cid, created, chat, {"role": "assistant", "content": ""}, None))
                            self.event(self.chunk(cid, created, chat, piece, None))
                            if token_delay:
                                time.sleep(token_delay)
                except (BrokenPipeError, ConnectionResetError):
                    print(f"stream cancelled by the client after {len(out)} of {n_predict} tokens", flush=True)
                    self.close_connection = True
                    return
                except ModelError as e:
                    print(f"model error mid-answer: {e}", flush=True)
                    if not stream:
                        self.error(500, str(e), "server_error")
                    self.close_connection = True
                    return
                t2 = time.monotonic()
            timings = {"prompt_n": prompt_n, "cache_n": cache_n, "prompt_ms": (t1 - t0) * 1e3,
                       "predicted_n": n_predict, "predicted_ms": (t2 - t1) * 1e3}
            usage = {"prompt_tokens": len(tokens), "completion_tokens": n_predict,
                     "total_tokens": len(tokens) + n_predict}
            content = "".join(out)
            if stream:
                try:
                    if native:
                        last = {"content": "", "stop": True, "model": name}
                    else:
                        last = self.chunk(cid, created, chat, None, "length")
                    last["timings"] = timings
                    last["usage"] = usage
                    self.event(last)
                    self.raw(b"data: [DONE]\n\n")
                    self.raw(b"")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                return
            if native:
                self.send_json(200, {"content": content, "model": name, "stop": True,
                                     "tokens_evaluated": len(tokens), "timings": timings,
                                     **({"tokens": ids} if return_tokens else {})})
                return
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": "length"}
            self.send_json(200, {"id": cid, "object": "chat.completion" if chat else "text_completion",
                                 "created": created, "model": req.get("model", name), "choices": [choice],
                                 "usage": usage, "timings": timings})

        def chunk(self, cid, created, chat, piece, finish):
            if chat:
                delta = piece if isinstance(piece, dict) else ({"content": piece} if piece is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
                obj = "text_completion"
            return {"id": cid, "object": obj, "created": created, "model": name, "choices": [choice]}

        def event(self, obj):
            self.raw(b"data: " + json.dumps(obj).encode() + b"\n\n")

        def raw(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", required=True, help="the model's name (seeds its weights)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--ctx-size", "-c", type=int, default=4096, help="KV cache positions")
    ap.add_argument("--weights-mb", type=float, default=16)
    ap.add_argument("--token-delay-ms", type=float, default=0, help="pause after each streamed token")
    ap.add_argument("--lib", default=os.environ.get("STANDIN_MODEL_LIB", ""), help="standin_model.so")
    ap.add_argument("--sleep-idle-seconds", type=float, default=-1,
                    help="free the model after this long without a request, as llama-server does (off when <= 0)")
    args, unknown = ap.parse_known_args()
    if unknown:
        print(f"ignoring llama-server options: {' '.join(unknown)}", flush=True)
    if not args.lib:
        sys.exit("standin_server: --lib or STANDIN_MODEL_LIB names standin_model.so")
    weight_bytes = int(args.weights_mb * (1 << 20)) // 8 * 8
    model = Model(args.lib, args.model, weight_bytes, args.ctx_size)
    if args.sleep_idle_seconds > 0:
        def watch():
            while True:
                time.sleep(0.05)
                model.sleep_if_idle(args.sleep_idle_seconds)

        threading.Thread(target=watch, daemon=True).start()
    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            print(f"connection from {client_address[0]}:{client_address[1]}: {sys.exc_info()[1]!r}", flush=True)

    httpd = Server((args.host, args.port), make_handler(model, args.model, args.token_delay_ms / 1e3))
    print(f"standin llama-server: model {args.model}, {weight_bytes} weight bytes, ctx {args.ctx_size}, "
          f"listening on http://{args.host}:{args.port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
