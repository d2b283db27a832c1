"""``attrserve attribute``: plan the run (every check before any work), then attribute the
file chunk by chunk, keeping each finished chunk, and write the output."""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from model_registry.spec import ModelSpec
from service.cli.offline.batch import attribute_batch, check_batch, chunk_target
from service.cli.offline.engine import kind_of, limit_threads
from service.cli.offline.formats import OUTPUT_SUFFIXES, _bad, _pyarrow
from service.cli.offline.inputs import Examples, read_examples
from service.cli.offline.options import describe, parse_target, request_from_args, say
from service.cli.offline.outputs import write_output
from service.cli.offline.progress import Progress
from service.core.errors import InvalidRequest, LimitExceeded, ServiceError, UnknownModel
from service.core.settings import Settings

#: examples per chunk when ``--batch-size`` is not given (fewer where the cost limit says so)
DEFAULT_BATCH_SIZE = 64


def _file_id(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _baselines(args: argparse.Namespace, spec: ModelSpec) -> tuple[Any, Any]:
    """``--baselines``: a number, or a file read as the inputs are; and its fingerprint."""
    text = args.baselines
    if text is None:
        return None, None
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number, number
    b = read_examples(text, spec)
    if b.arrays is None:
        raise InvalidRequest(f"{text}: baselines must be tensors, not texts")
    arrays = [b.arrays[i.name] for i in spec.inputs]
    return (arrays[0] if len(arrays) == 1 else arrays), _file_id(Path(text))


def _per_example(baselines: Any, n: int, spec: ModelSpec, request: dict[str, Any]) -> bool:
    """Whether file baselines give one row per example (sliced with the chunks) rather than
    one to broadcast or a distribution the method samples (passed whole to every chunk)."""
    if n <= 1 or baselines is None or isinstance(baselines, float):
        return False
    first = baselines if isinstance(baselines, np.ndarray) else baselines[0]
    if first.ndim != len(spec.inputs[0].shape) or first.shape[0] != n:
        return False
    ms = kind_of(spec).check(spec, request["method"], request.get("params") or {}, None).method
    return not ms.baseline_distribution


def _spec(models: str | None, model_id: str) -> ModelSpec:
    import model_registry

    try:
        specs = {s.id: s for s in model_registry.load_specs(models)}
    except model_registry.RegistryError as exc:
        raise InvalidRequest(str(exc)) from None
    if model_id not in specs:
        raise UnknownModel(f"unknown model {model_id!r}; the models are {sorted(specs)}")
    return specs[model_id]


def _cut(request: dict[str, Any], baselines: Any, start: int, stop: int) -> dict[str, Any]:
    """The request for examples ``start`` to ``stop``: per-example baselines cut to them."""
    if baselines is None:
        return request
    b = baselines
    part = b[start:stop] if isinstance(b, np.ndarray) else [x[start:stop] for x in b]
    return {**request, "baselines": part}


@dataclass
class RunPlan:
    spec: ModelSpec
    settings: Settings
    request: dict[str, Any]
    examples: Examples
    baselines: Any  # per-example baselines, cut with the chunks; else None
    chunk: int
    progress: Progress

    def request_for(self, start: int, stop: int) -> dict[str, Any]:
        return _cut(self.request, self.baselines, start, stop)


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Everything checked before any work: the model, the request, the file, the first chunk."""
    settings = Settings.from_env(models=args.models)
    output = Path(args.output)
    if output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise _bad(output, f"unknown output format; use one of {OUTPUT_SUFFIXES}")
    if output.suffix.lower() == ".parquet":
        _pyarrow(output)
    spec = _spec(settings.models, args.model)
    request = request_from_args(args)
    target = parse_target(args.target)
    baselines, baselines_id = _baselines(args, spec)
    examples = read_examples(args.inputs, spec)
    if isinstance(target, list):  # one per example of the whole file: it goes with the rows
        if len(target) != examples.n:
            raise InvalidRequest(
                f"target has {len(target)} entries; give one per example ({examples.n})",
                loc=("body", "target"),
            )
        own = examples.targets or [None] * examples.n
        targets = [t if t is not None else d for t, d in zip(own, target, strict=True)]
        examples = replace(examples, targets=targets)
    chunk_target(examples, request["target"])  # the targets' form, before any work
    sliced = _per_example(baselines, examples.n, spec, request)
    if not sliced:
        request["baselines"] = baselines
    chunk = args.batch_size
    if chunk is not None and not 1 <= chunk <= settings.max_batch_size:
        raise LimitExceeded(
            f"--batch-size {chunk} must be 1..{settings.max_batch_size} (this server's "
            "examples per request, ATTRSERVE_MAX_BATCH_SIZE)"
        )
    per_row = baselines if sliced else None

    def first_chunk(size: int) -> None:  # fails here, before the model loads or the bar starts
        check_batch(settings, spec, _cut(request, per_row, 0, size), examples.slice(0, size))

    if chunk is not None:
        first_chunk(chunk)
    else:
        chunk = min(DEFAULT_BATCH_SIZE, settings.max_batch_size)
        try:
            first_chunk(chunk)
        except LimitExceeded:  # over the cost limit: as many examples as it allows
            one = check_batch(settings, spec, _cut(request, per_row, 0, 1), examples.slice(0, 1))
            chunk = max(1, min(chunk, settings.max_cost // max(1, one.cost)))
            first_chunk(chunk)
    options = {
        "model": spec.id,
        "version": spec.version,
        "models": None if settings.models is None else _file_id(Path(settings.models)),
        "request": {**request, "baselines": baselines_id},
        "targets": examples.targets,
    }
    digest = hashlib.sha256(orjson.dumps(options, option=orjson.OPT_SORT_KEYS)).hexdigest()
    progress = Progress(
        output,
        {
            "input": _file_id(Path(args.inputs)),
            "options_sha256": digest,
            "chunk_size": chunk,
            "examples": examples.n,
            "chunks": math.ceil(examples.n / chunk),
        },
    )
    return RunPlan(spec, settings, request, examples, per_row, chunk, progress)


def main(args: argparse.Namespace) -> int:
    """``attrserve attribute``: 0 done, 2 a request or file the HTTP API would refuse (said
    on stderr), 130 interrupted (progress kept; the same command resumes)."""
    try:
        plan = plan_run(args)
    except ServiceError as err:
        say(f"error: {describe(err)}")
        return 2
    except KeyboardInterrupt:
        say("interrupted before any work")
        return 130
    progress, n, size = plan.progress, plan.examples.n, plan.chunk
    total = math.ceil(n / size)
    note = progress.open()
    if note and not args.quiet:
        say(note)
    try:
        return _work(args, plan, total)
    except KeyboardInterrupt:
        if progress.done:
            say(
                f"interrupted after {progress.done} of {total} chunks; run the same command "
                f"again to resume (progress is kept in {progress.dir}/)"
            )
        else:
            say("interrupted before the first chunk finished; nothing was kept")
        return 130


def _work(args: argparse.Namespace, plan: RunPlan, total: int) -> int:
    from tqdm import tqdm

    import model_registry

    progress, n, size = plan.progress, plan.examples.n, plan.chunk
    if plan.settings.torch_threads:  # as a server's worker would compute (else torch's own)
        limit_threads(plan.settings.torch_threads)
    try:
        lm = model_registry.load(plan.spec)
    except model_registry.RegistryError as exc:
        say(f"error: {exc}")
        return 2
    quiet = args.quiet or not sys.stderr.isatty()
    with tqdm(
        total=n,
        initial=min(progress.done * size, n),
        unit="ex",
        desc=f"{plan.spec.id} {plan.request['method']}",
        file=sys.stderr,
        disable=quiet,
        dynamic_ncols=True,
    ) as bar:
        for k in range(progress.done, total):
            start, stop = k * size, min(n, (k + 1) * size)
            try:
                cols = attribute_batch(
                    lm,
                    plan.spec,
                    plan.request_for(start, stop),
                    plan.examples.slice(start, stop),
                    plan.settings,
                )
            except ServiceError as err:
                bar.close()
                say(f"error: {describe(err, (start, stop) if total > 1 else None)}")
                if progress.done:
                    say(f"{progress.done} finished chunks are kept in {progress.dir}/")
                return 2
            progress.save(k, cols)
            bar.update(stop - start)
    write_output(args.output, list(progress.chunks()))
    progress.remove()
    if not args.quiet:
        say(f"wrote {n} examples to {args.output}")
    return 0
