"""A minimal proxy for prefill/decode disaggregation over vLLM's NixlConnector.

The protocol of vLLM's toy proxy, for non-streaming completions: each request
goes to the prefill instance first, as a one-token request asking it to keep
the prompt's KV for a remote decode (``kv_transfer_params.do_remote_decode``);
its answer says where the KV blocks are. The request then goes to the decode
instance with those ``kv_transfer_params``: it reads the blocks over NIXL and
generates the whole answer, which is returned as it is.

    python examples/disagg_proxy.py --port 8000 \\
        --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

import argparse
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

# Options that cannot apply to the one-token prefill request.
PREFILL_DROPS = ("min_tokens", "stream_options")


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    request = {k: v for k, v in body.items() if k not in PREFILL_DROPS}
    request.update(
        max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True}
    )
    return request


def make_app(prefill_url: str, decode_url: str, timeout_s: float) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(timeout=timeout_s)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prefilled = await client.post(
            f"{prefill_url}/v1/completions", json=prefill_request(body)
        )
        if prefilled.status_code != 200:
            return JSONResponse(prefilled.json(), prefilled.status_code)
        params = prefilled.json()["kv_transfer_params"]
        decoded = await client.post(
            f"{decode_url}/v1/completions", json={**body, "kv_transfer_params": params}
        )
        return JSONResponse(decoded.json(), decoded.status_code)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", required=True, help="prefill instance URL")
    parser.add_argument("--decode", required=True, help="decode instance URL")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds")
    args = parser.parse_args()
    app = make_app(args.prefill, args.decode, args.timeout)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
