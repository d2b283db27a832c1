"""``methods.export``: an attribution step as a ``torch.export`` program.

``export(model, "saliency", x, target=3)`` returns a ``torch.export.ExportedProgram`` whose
``forward(*inputs)`` returns what ``methods.attribute(model, inputs, "saliency", target=3)
.attributions`` returns, for any batch size. ``torch.export.save`` writes it to one file;
``torch.export.load(...).module()(x)`` gives the heatmap with only torch installed.

How: ``methods.attribute`` itself is traced (one implementation, not a second one written for
export). ``make_fx`` records every aten op the call runs, the model's forward, autograd's
backward kernels and the engine's own rules (DeepLift, guided backprop and deconvolution
intercept the non-linearities, ``methods.engine.intercept``), over fake inputs whose batch
size is a symbol; the graph of plain aten ops is then exported with that dim dynamic
(``torch.export.Dim``). Whatever Python decides once per call (parameters, quadrature points,
the target's form) is baked in. A step that turns the batch size into a Python int (chunking
by ``internal_batch_size``, a loop over examples) would pin the graph to the example's batch:
such traces are refused, never returned, and so are results that differ from the eager call.

Targets: ``None``, an int or an index tuple are baked in (Captum's meaning). ``target="input"``
makes the class an input instead: the program's last argument is an int64 tensor ``(N,)``,
one class per example, for a model with outputs ``(N, C)`` (the per-example list form of
``methods.attribute``); out-of-range classes fail at run time.

Saving: ``save(program, path)`` (``from methods.export import save, load``) writes the
program with ``torch.export.save`` and a description of the step it computes (method,
effective params, target mode, input specs) as the archive's extra file ``attrserve.json``;
``load(path)`` reads both back, and the service serves such a file as
``source = "attribution-export:PATH"``.

Randomness (``gradient_shap``): the program draws from torch's default generator at every call,
as a model with dropout would; ``torch.manual_seed(s)`` before the call gives exactly
``methods.attribute(..., seed=s)``'s numbers on the CPU. A seed cannot be baked into the graph.

Layout: ``trace`` (which methods and arguments export, the trace over a symbolic batch, the
check against the eager call) and ``archive`` (the description, ``save``, ``load``,
``read_description``).
"""

from methods.export.archive import (
    DESCRIPTION_FILE,
    DESCRIPTION_FORMAT,
    TARGET_INPUT,
    description,
    load,
    read_description,
    save,
)
from methods.export.trace import EXPORTABLE, NotExportableError, export

__all__ = [
    "DESCRIPTION_FILE",
    "DESCRIPTION_FORMAT",
    "EXPORTABLE",
    "TARGET_INPUT",
    "NotExportableError",
    "description",
    "export",
    "load",
    "read_description",
    "save",
]
