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
import time
from pathlib import Path
from typing import Any, NoReturn

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
    p.add_argument("--inputs", default=None,
                   help='the predictor\'s inputs: NAME:DTYPE:DIMS (dims comma-separated: sizes, '
                   'or names for free dims, N the batch), several separated by ";", e.g. '
                   '"x:float32:N,12". Default: what a V2 predictor\'s metadata lists, else one '
                   'float32 input of rows of any length (x:float32:N,F)')  # fmt: skip
    p.add_argument("--labels", default=None, help="class names, comma-separated")
    p.add_argument(
        "--output-shape",
        "--output_shape",
        default=None,
        dest="output_shape",
        help="the output per example, no batch dim (without labels), e.g. 3; default: one "
        "score per class, as many as the predictor answers",
    )
    p.add_argument("--method", default="feature_ablation",
                   help="the default explanation (a perturbation method)")  # fmt: skip
    p.add_argument("--params", default=None, help="its parameters, a JSON object")
    p.add_argument("--max-batch", "--max_batch", type=int, default=None, dest="max_batch")
    p.add_argument("--max-concurrency", "--max_concurrency", type=int, default=None,
                   dest="max_concurrency")  # fmt: skip
    p.add_argument("--timeout-s", "--timeout_s", type=float, default=None, dest="timeout_s")
    p.set_defaults(handler=run)


def _fail(flag: str, message: str) -> NoReturn:
    raise SystemExit(f"attrserve explain-for: error: {flag}: {message}")


def _dims(text: str, flag: str) -> list[int | str]:
    """``N,3,32,32`` as ``["N", 3, 32, 32]``: sizes, and names for free dims."""
    out: list[int | str] = []
    for d in (d.strip() for d in text.split(",")):
        if d.isdigit() and int(d) > 0:
            out.append(int(d))
        elif d.isidentifier():
            out.append(d)
        else:
            _fail(flag, f"expected sizes or names of free dims, comma-separated; got {d!r}")
    return out


def _inputs(text: str) -> list[dict[str, Any]]:
    out = []
    for part in filter(None, (s.strip() for s in text.split(";"))):
        try:
            name, dtype, dims = part.split(":")
        except ValueError:
            _fail("--inputs", f"expected NAME:DTYPE:DIMS, got {part!r}")
        shape = _dims(dims, "--inputs")
        if not isinstance(shape[0], str):
            _fail("--inputs", f"dim 0 is the batch and must be free (N), got {part!r}")
        out.append({"name": name, "dtype": dtype, "shape": shape})
    return out


def _url(host: str) -> str:
    """``--predictor-host`` as a URL (http:// assumed)."""
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def described_inputs(url: str, name: str, wait_s: float = 10.0) -> list[dict[str, Any]] | None:
    """A V2 predictor's inputs as its metadata (``GET /v2/models/{name}``) lists them, waiting
    up to ``wait_s`` for it to answer (KServe starts the explainer beside the predictor); None
    when it does not answer, lists none, or lists one we cannot send."""
    import httpx

    from model_registry.sources.remote import DATATYPES

    dtypes = {oip: name for name, oip in DATATYPES.items()}  # the ones a remote input sends
    deadline = time.monotonic() + wait_s
    while True:
        try:
            r = httpx.get(f"{url.rstrip('/')}/v2/models/{name}", timeout=2)
            if r.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)
    try:
        listed = r.json().get("inputs") or []
        out = []
        for i in listed:
            dims: list[int | str] = [d if d > 0 else f"D{j}" for j, d in enumerate(i["shape"])]
            dims[0] = "N"  # what the predictor takes, a batch of
            out.append({"name": i["name"], "dtype": dtypes[i["datatype"]], "shape": dims})
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return out or None


#: without --inputs and metadata: one float32 input of rows of any length
ROWS = [{"name": "x", "dtype": "float32", "shape": ["N", "F"]}]


def models_toml(args: argparse.Namespace, inputs: list[dict[str, Any]] | None = None) -> str:
    """The one-model models.toml the flags describe (strings JSON-quoted: TOML's basic
    strings); ``inputs`` stands for ``--inputs`` where that is not given (default ``ROWS``)."""
    url = _url(args.predictor_host)
    q = json.dumps
    tables = []
    given = _inputs(args.inputs) if args.inputs else inputs or ROWS
    for i in given:
        dims = ", ".join(q(d) if isinstance(d, str) else str(d) for d in i["shape"])
        tables.append(f"{{ name = {q(i['name'])}, dtype = {q(i['dtype'])}, shape = [{dims}] }}")
    lines = [
        "[[models]]",
        f"id = {q(args.model_name)}",
        f"source = {q('remote:' + PROTOCOLS[args.protocol])}",
        f"url = {q(url)}",
        f"model_name = {q(args.model_name)}",
        f"inputs = [{', '.join(tables)}]",
    ]
    if args.labels:
        lines.append(f"labels = [{', '.join(q(s.strip()) for s in args.labels.split(','))}]")
    if args.output_shape is not None or not args.labels:
        # a score per class, as many as the predictor answers, unless told
        shape = _dims(args.output_shape, "--output-shape") if args.output_shape else ["C"]
        lines.append(f"output_shape = [{', '.join(q(d) for d in shape)}]")
    try:
        params = json.loads(args.params) if args.params else {}
    except ValueError as exc:
        _fail("--params", f"expected a JSON object ({exc})")
    if not isinstance(params, dict):
        _fail("--params", f"expected a JSON object, got {args.params!r}")
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
    inputs = None
    if args.inputs is None and args.protocol == "v2":
        inputs = described_inputs(_url(args.predictor_host), args.model_name)
    path.write_text(models_toml(args, inputs))
    serve(argparse.Namespace(host=args.host, port=args.http_port, models=str(path)))
    return 0
