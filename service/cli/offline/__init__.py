"""``attrserve attribute``: the engine over a file of examples, in this process, resumable.

Each chunk of examples goes through the HTTP route's own checks (``build_work``, with the
server's limits) and its own engine call (``run_work``), so a file gives the numbers, errors and
limits a request would. The pieces, kept stable for other runners (Ray Data calls them too):

    examples = read_examples("x.parquet", spec)          # .npy .npz .pt .parquet .jsonl
    request = {"method": "saliency", "target": 0}        # the request's fields but inputs
    check_batch(settings, spec, request, examples.slice(0, 64))   # refusals, no model needed
    columns = attribute_batch(lm, spec, request, examples.slice(0, 64), settings)
    write_output("attr.npz", [columns, ...])             # .npz or .parquet, by suffix

A column is an array with one row per example (``outputs``, ``target``, tensor attributions)
or, for raw texts, a list with one item per example: ``tokens`` and the per-token scores
(their lengths differ from text to text). ``request_from_args``, ``parse_target`` and
``describe`` turn the command's options into a request and a ServiceError into its message.

Layout: ``formats`` (the suffixes, the ``target`` entry, a file's errors), ``inputs``
(``Examples``, ``read_examples``), ``batch`` (one chunk: ``check_batch``,
``attribute_batch``), ``outputs`` (``write_output``), ``progress`` (finished chunks kept for
a resume), ``options`` (the options as a request, the messages), ``command`` (``plan_run``,
``main``), and ``engine``: the only module that imports the service's serving, wire and worker
layers.
"""

from service.cli.offline.batch import attribute_batch, check_batch, chunk_target
from service.cli.offline.command import DEFAULT_BATCH_SIZE, RunPlan, main, plan_run
from service.cli.offline.formats import INPUT_SUFFIXES, OUTPUT_SUFFIXES, TARGET
from service.cli.offline.inputs import Examples, read_examples
from service.cli.offline.options import PROG, describe, parse_target, request_from_args, say
from service.cli.offline.outputs import write_output
from service.cli.offline.progress import Progress

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "INPUT_SUFFIXES",
    "OUTPUT_SUFFIXES",
    "PROG",
    "TARGET",
    "Examples",
    "Progress",
    "RunPlan",
    "attribute_batch",
    "check_batch",
    "chunk_target",
    "describe",
    "main",
    "parse_target",
    "plan_run",
    "read_examples",
    "request_from_args",
    "say",
    "write_output",
]
