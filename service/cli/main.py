"""The ``attrserve`` command: ``serve``, ``openapi``, ``bench``, ``attribute``, ``ray serve``,
``explain-for``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from service.cli import explain_for
from service.cli.serving import serve


def openapi_spec() -> dict[str, Any]:
    """The app's OpenAPI document (built without starting workers)."""
    from service.app import create_app
    from service.core.settings import Settings

    spec: dict[str, Any] = create_app(Settings(), start_workers=False).openapi()
    return spec


def openapi_text() -> str:
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    return orjson.dumps(openapi_spec(), option=options).decode() + "\n"


#: the source checkout holding this package, where ``benchmarks/`` lives (not installed)
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def bench(rest: list[str]) -> int:
    """``attrserve bench [-- OPTIONS]``: ``python -m benchmarks.load OPTIONS`` in its own
    process, from the source checkout (the benchmarks are not part of the installed package);
    its exit status."""
    checkout = (SOURCE_ROOT / "pyproject.toml").is_file()
    if not (checkout and (SOURCE_ROOT / "benchmarks" / "load.py").is_file()):
        sys.stderr.write(
            "attrserve bench: error: the load benchmark is not installed with attrserve; "
            "run it from a source checkout: python -m benchmarks.load\n"
        )
        return 2
    rest = rest[1:] if rest[:1] == ["--"] else rest  # argparse keeps the "--" before options
    return subprocess.call([sys.executable, "-m", "benchmarks.load", *rest], cwd=SOURCE_ROOT)


#: modules whose absence means Ray is not installed (``attrserve[ray]``)
RAY_MODULES = ("ray", "service.cli.ray")


def _ray_missing(exc: ModuleNotFoundError) -> bool:
    name = exc.name or ""
    return any(name == m or name.startswith(m + ".") for m in RAY_MODULES)


def _attribute(args: argparse.Namespace) -> int:
    if args.ray:
        ray_cli = __import__("service.cli.ray", fromlist=["attribute"])
        rc: int = ray_cli.attribute(args)
        return rc
    if args.address is not None:
        sys.stderr.write("attrserve attribute: error: --address needs --ray\n")
        return 2
    from service.cli import offline

    return offline.main(args)


def _add_attribute(sub: Any) -> None:
    p = sub.add_parser(
        "attribute",
        help="attribute a file of examples offline (no server), resumably",
        description="Run the attribution engine over a file of examples in this process, "
        "with the HTTP API's checks and limits, and write the attributions. An interrupted "
        "run continues where it stopped when the same command is run again.",
    )
    p.add_argument("--model", required=True, metavar="ID", help="model id")
    p.add_argument("--models", default=None, metavar="FILE", help="models.toml (ATTRSERVE_MODELS)")
    p.add_argument("--method", required=True, metavar="M", help="method (GET /v1/methods)")
    p.add_argument(
        "--inputs",
        required=True,
        metavar="FILE",
        help="examples: .npy, .npz, .pt, .parquet or .jsonl",
    )
    p.add_argument("--output", required=True, metavar="FILE", help="attributions: .npz or .parquet")
    p.add_argument(
        "--target",
        default=None,
        metavar="T",
        help="as in the HTTP API: 3, a label, predicted, [1, 0, ...] (one per example), "
        '{"index": [2, 3]}; JSON when it parses, else a label',
    )
    p.add_argument(
        "--params", default=None, metavar="JSON", help="method params as JSON: '{\"n_steps\": 32}'"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="N",
        help="examples per chunk (default: up to 64, within the cost limit)",
    )
    p.add_argument(
        "--baselines", default=None, metavar="FILE", help="a number, or a file read like --inputs"
    )
    p.add_argument(
        "--seed", type=int, default=None, metavar="N", help="seed for stochastic methods"
    )
    p.add_argument(
        "--convergence-delta",
        action="store_true",
        help="also write the convergence delta (return_convergence_delta)",
    )
    p.add_argument("--internal-batch-size", default=None, metavar="N", help="an int or 'auto'")
    p.add_argument("--perturbations-per-eval", default=None, metavar="N", help="an int or 'auto'")
    p.add_argument(
        "--noise-tunnel", default=None, metavar="JSON", help='JSON: \'{"nt_type": "smoothgrad"}\''
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes")
    p.add_argument(
        "--ray", action="store_true", help="run on a Ray cluster with Ray Data (attrserve[ray])"
    )
    p.add_argument("--address", default=None, metavar="A", help="Ray cluster address (with --ray)")
    p.set_defaults(handler=_attribute)


def _add_ray(sub: Any) -> None:
    p_ray = sub.add_parser("ray", help="run on a Ray cluster (attrserve[ray])")
    ray_sub = p_ray.add_subparsers(dest="ray_command", required=True)
    p = ray_sub.add_parser("serve", help="deploy the HTTP app on Ray Serve")
    p.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    p.add_argument(
        "--replicas", type=int, default=None, help="replicas (default: one per GPU, else 1)"
    )
    p.add_argument("--gpus-per-replica", type=float, default=None, help="GPUs per replica")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling: the fewest")
    p.add_argument(
        "--max-replicas", type=int, default=None, help="autoscaling: the most (unset: fixed)"
    )
    p.add_argument("--host", default=None, help="HTTP bind address (ATTRSERVE_HOST)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (ATTRSERVE_PORT)")
    p.add_argument("--models", default=None, help="models.toml (ATTRSERVE_MODELS)")
    p.set_defaults(
        handler=lambda args: __import__("service.cli.ray", fromlist=["serve"]).serve(args)
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``attrserve`` argument parser (subcommands with a ``handler`` default)."""
    parser = argparse.ArgumentParser(prog="attrserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="serve the models over HTTP")
    p_serve.add_argument("--host", default=None, help="bind address (ATTRSERVE_HOST)")
    p_serve.add_argument("--port", type=int, default=None, help="port (ATTRSERVE_PORT)")
    p_serve.add_argument("--models", default=None, help="models.toml (ATTRSERVE_MODELS)")
    sub.add_parser("openapi", help="print the OpenAPI document")
    p_bench = sub.add_parser(
        "bench", help="run the HTTP load benchmark (a source checkout): bench -- [its options]"
    )
    p_bench.add_argument("rest", nargs=argparse.REMAINDER)
    _add_attribute(sub)
    _add_ray(sub)
    explain_for.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The console script; the exit status (``attribute``: 2 for a refused request, 130
    when interrupted)."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "openapi":
        sys.stdout.write(openapi_text())
    elif args.command == "bench":
        return bench(args.rest)
    else:
        try:
            rc: int = args.handler(args)
        except ModuleNotFoundError as exc:
            if not _ray_missing(exc):
                raise
            sys.stderr.write(
                f"attrserve {args.command}: error: this needs Ray ({exc.msg}); "
                "install attrserve[ray]: pip install 'attrserve[ray]'\n"
            )
            return 2
        return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
