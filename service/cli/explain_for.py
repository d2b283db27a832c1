"""``attrserve explain-for``: serve KServe's ``:explain`` for one model that another server
predicts (a KServe predictor, Triton, MLServer), as KServe's explainer container.

KServe starts an explainer with ``--model_name``, ``--predictor_host`` and ``--http_port``
(plus the ``args`` of the InferenceService's ``explainer`` spec) and routes ``:explain`` to
it; this command writes the one-model models.toml for that predictor (a ``remote:`` source,
``model_registry.sources.remote``) and serves it as ``attrserve serve`` does: the same routes,
queue, limits and errors, the predictor called for every forward. Both spellings of each flag
are taken (``--model-name`` and KServe's ``--model_name``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

PROTOCOLS = {"v1": "kserve-v1", "v2": "oip-v2"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain-for",
        help="serve :explain for one remote predictor (KServe's explainer container)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-name", "--model_name", required=True, dest="model_name",
                   help="the model's name, here and on the predictor")  # fmt: skip
    p.add_argument("--predictor-host", "--predictor_host", required=True, dest="predictor_host",
                   help="HOST[:PORT] of the predictor (http:// assumed), or its URL")  # fmt: skip
    p.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        default="v1",
        help="the predictor's protocol: KServe V1, or V2 (Open Inference Protocol)",
    )
    p.add_argument("--http-port", "--http_port", "--port", type=int, default=8080, dest="http_port",
                   help="the port to serve on")  # fmt: skip
    p.add_argument("--host", default="0.0.0.0", help="bind address")
    p.add_argument("--inputs", required=True,
                   help='the predictor\'s inputs: NAME:DTYPE:DIMS (dims comma-separated, N the '
                   'batch), several separated by ";", e.g. "x:float32:N,12"')  # fmt: skip
    p.add_argument("--labels", default=None, help="class names, comma-separated")
    p.add_argument(
        "--output-shape",
        "--output_shape",
        default=None,
        dest="output_shape",
        help="the output per example, no batch dim (without labels), e.g. 3",
    )
    p.add_argument("--method", default="feature_ablation",
                   help="the default explanation (a perturbation method)")  # fmt: skip
    p.add_argument("--params", default=None, help="its parameters, a JSON object")
    p.add_argument("--max-batch", "--max_batch", type=int, default=None, dest="max_batch")
    p.add_argument("--max-concurrency", "--max_concurrency", type=int, default=None,
                   dest="max_concurrency")  # fmt: skip
    p.add_argument("--timeout-s", "--timeout_s", type=float, default=None, dest="timeout_s")
    p.set_defaults(handler=run)


def _inputs(text: str) -> list[dict[str, Any]]:
    out = []
    for part in filter(None, (s.strip() for s in text.split(";"))):
        try:
            name, dtype, dims = part.split(":")
        except ValueError:
            raise SystemExit(
                f"attrserve explain-for: error: --inputs: expected NAME:DTYPE:DIMS, got {part!r}"
            ) from None
        shape: list[Any] = [d if d == "N" else int(d) for d in dims.split(",")]
        out.append({"name": name, "dtype": dtype, "shape": shape})
    return out


def models_toml(args: argparse.Namespace) -> str:
    """The one-model models.toml the flags describe (strings JSON-quoted: TOML's basic
    strings)."""
    host = args.predictor_host
    url = host if host.startswith(("http://", "https://")) else f"http://{host}"
    q = json.dumps
    tables = []
    for i in _inputs(args.inputs):
        dims = ", ".join(q(d) if d == "N" else str(d) for d in i["shape"])
        tables.append(f"{{ name = {q(i['name'])}, dtype = {q(i['dtype'])}, shape = [{dims}] }}")
    inputs = ", ".join(tables)
    lines = [
        "[[models]]",
        f"id = {q(args.model_name)}",
        f"source = {q('remote:' + PROTOCOLS[args.protocol])}",
        f"url = {q(url)}",
        f"model_name = {q(args.model_name)}",
        f"inputs = [{inputs}]",
    ]
    if args.labels:
        lines.append(f"labels = [{', '.join(q(s.strip()) for s in args.labels.split(','))}]")
    if args.output_shape is not None:
        shape = [int(d) for d in args.output_shape.split(",") if d.strip()]
        lines.append(f"output_shape = {shape}")
    params = json.loads(args.params) if args.params else {}
    explain = f"{{ method = {q(args.method)}, params = {_toml_table(params)} }}"
    lines.append(f"explain = {explain}")
    for key in ("max_batch", "max_concurrency", "timeout_s"):
        value = getattr(args, key)
        if value is not None:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def _toml_table(value: dict[str, Any]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, dict):
            return _toml_table(v)
        if isinstance(v, list):
            return "[" + ", ".join(one(x) for x in v) + "]"
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)

    return "{ " + ", ".join(f"{json.dumps(k)} = {one(v)}" for k, v in value.items()) + " }"


def run(args: argparse.Namespace) -> int:
    from service.cli.serving import serve

    folder = Path(tempfile.mkdtemp(prefix="attrserve-explainer-"))
    path = folder / "models.toml"
    path.write_text(models_toml(args))
    serve(argparse.Namespace(host=args.host, port=args.http_port, models=str(path)))
    return 0
