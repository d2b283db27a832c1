"""models.toml's ``compile``, ``compile_mode`` and ``verify_device`` keys, and
``attribution-export:`` sources (a program saved by ``methods.export.save``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import methods
import model_registry
from methods.errors import InvalidArgumentError
from methods.export import load, read_description, save
from model_registry import RegistryError

MINIMAL = '[[models]]\nid = "m"\nsource = "builtin:tabular-mlp"\n'
SCRIPT = (
    '[[models]]\nid = "m"\nsource = "torchscript:s.pt"\noutput_shape = []\n'
    'inputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]\n'
)
PROGRAM = '[[models]]\nid = "m"\nsource = "attribution-export:p.pt2"\n'


def specs(tmp_path: Path, text: str) -> list[model_registry.ModelSpec]:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return model_registry.load_specs(path)


def tabular() -> torch.nn.Module:
    spec = {s.id: s for s in model_registry.builtin_specs()}["tabular-mlp"]
    model: torch.nn.Module = model_registry.load(spec).model
    return model


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("programs")
    model = tabular()
    save(methods.export(model, "saliency", torch.zeros(2, 8), target=1), tmp / "p.pt2")
    save(methods.export(model, "integrated_gradients", torch.zeros(2, 8), target="input",
                        n_steps=6), tmp / "ig.pt2")  # fmt: skip
    plain = methods.export(model, "saliency", torch.zeros(2, 8), target=0)
    torch.export.save(plain, tmp / "plain.pt2")
    (tmp / "s.pt").write_bytes(b"")
    (tmp / "junk.pt2").write_bytes(b"not a zip")
    return tmp


def test_runtime_keys_default_and_parse(tmp_path: Path) -> None:
    (spec,) = specs(tmp_path, MINIMAL)
    assert (spec.compile, spec.compile_mode, spec.verify_device) == (False, "default", None)
    text = MINIMAL + 'compile = true\ncompile_mode = "max-autotune"\nverify_device = false\n'
    (spec,) = specs(tmp_path, text)
    assert (spec.compile, spec.compile_mode, spec.verify_device) == (True, "max-autotune", False)
    assert (spec.fidelity_sample, spec.fidelity_tolerance) == (None, 0.05)
    (spec,) = specs(tmp_path, MINIMAL + "fidelity_sample = 1\nfidelity_tolerance = 0.02\n")
    assert (spec.fidelity_sample, spec.fidelity_tolerance) == (1.0, 0.02)


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        (MINIMAL + 'compile = "yes"\n', "compile", "expected true or false"),
        (MINIMAL + 'compile_mode = "default"\n', "compile_mode", "with compile = true"),
        (MINIMAL + 'compile = true\ncompile_mode = "fast"\n', "compile_mode", "expected one of"),
        (MINIMAL + "verify_device = 1\n", "verify_device", "expected true or false"),
        (MINIMAL + "fidelity_sample = 1.5\n", "fidelity_sample", "a number from 0 to 1"),
        (MINIMAL + 'fidelity_sample = "all"\n', "fidelity_sample", "a number from 0 to 1"),
        (MINIMAL + "fidelity_tolerance = 0\n", "fidelity_tolerance", "a positive number"),
        (MINIMAL + "fidelity_tolerance = true\n", "fidelity_tolerance", "a positive number"),
        (MINIMAL + 'method = "saliency"\n', "method", "only attribution-export"),
        (SCRIPT + "compile = true\n", "compile", "TorchScript"),
        (PROGRAM + 'layers = ["fc1"]\n', "layers", "no layers"),
        (PROGRAM + "compile = true\n", "compile", "already one graph"),
        (PROGRAM + "verify_device = true\n", "verify_device", "no model to compare"),
        (PROGRAM + 'method = "occlusion"\n', "method", "computes 'saliency', not 'occlusion'"),
        (PROGRAM + 'dtype = "float64"\n', "dtype", "computes in float32"),
        (PROGRAM + 'inputs = [{ name = "x", dtype = "float32", shape = ["N", 9] }]\n', "inputs",
         "takes float32[N, 8]; declared float32[N, 9]"),
        (PROGRAM + 'labels = ["a", "b"]\n', "labels", "gives [3] per example, not [2]"),
        (PROGRAM.replace("p.pt2", "ig.pt2") + "output_shape = [4]\n", "output_shape",
         "gives [3] per example, not [4]"),
        (PROGRAM.replace("p.pt2", "plain.pt2"), "method", "no attrserve.json description"),
        (PROGRAM.replace("p.pt2", "junk.pt2"), "source", "not a program saved"),
        (PROGRAM.replace("p.pt2", "nope.pt2"), "source", "not found"),
    ],
)  # fmt: skip
def test_errors_name_the_field(programs: Path, text: str, field: str, expected: str) -> None:
    with pytest.raises(RegistryError) as info:
        specs(programs, text)
    assert info.value.field == field, str(info.value)
    assert expected in str(info.value)


def test_attribution_export_spec_comes_from_the_file(programs: Path) -> None:
    (spec,) = specs(programs, PROGRAM.replace("p.pt2", "ig.pt2") + 'labels = ["l", "m", "h"]\n')
    step = spec.exported
    assert step is not None and step.method == "integrated_gradients"
    assert step.per_example_target and step.params is not None and step.params["n_steps"] == 6
    assert [(i.dtype, i.shape) for i in spec.inputs] == [("float32", (None, 8))]
    assert spec.output.shape == (3,) and spec.output.labels == ("l", "m", "h")
    lm = model_registry.load(spec)
    x = torch.linspace(-1, 1, 24).reshape(3, 8)
    with torch.no_grad():
        got = lm.model(x, torch.tensor([2, 0, 1]))
    want = methods.attribute(tabular(), x, "integrated_gradients", target=[2, 0, 1], n_steps=6)
    torch.testing.assert_close(got, want.attributions)


def test_a_file_without_description_takes_the_method_from_models_toml(programs: Path) -> None:
    text = PROGRAM.replace("p.pt2", "plain.pt2") + (
        'method = "saliency"\noutput_shape = [3]\n'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 8] }]\n'
    )
    (spec,) = specs(programs, text)
    assert spec.exported is not None and not spec.exported.described
    assert spec.exported.params is None
    model_registry.load(spec)  # the program runs on zeros at load


def test_save_and_load_keep_the_description(programs: Path, tmp_path: Path) -> None:
    program, desc = load(programs / "p.pt2")
    assert desc == read_description(programs / "p.pt2")
    assert desc is not None and desc["method"] == "saliency" and desc["target"] == 1
    assert desc["params"] == {"abs": True} and desc["output_shape"] == [3]
    save(program, tmp_path / "again.pt2")  # a loaded program keeps its description
    assert read_description(tmp_path / "again.pt2") == desc
    plain, none = load(programs / "plain.pt2")
    assert none is None and read_description(programs / "plain.pt2") is None
    with pytest.raises(InvalidArgumentError, match=r"not made by methods\.export"):
        save(plain, tmp_path / "plain.pt2")
    save(plain, tmp_path / "described.pt2", describe={"method": "saliency"})
    assert read_description(tmp_path / "described.pt2") == {"method": "saliency"}


def test_a_language_model_takes_its_answers_precision(tmp_path: Path) -> None:
    """precision, fidelity_sample and fidelity_tolerance apply to a causal LM's answers
    (they were refused: "generation runs in the model's dtype"); compile still does not."""
    lm = '[[models]]\nid = "m"\nsource = "builtin:tiny-lm"\n'
    (spec,) = specs(tmp_path, lm)
    assert (spec.precision, spec.fidelity_sample, spec.fidelity_tolerance) == (None, None, 0.05)
    text = lm + 'precision = "bfloat16"\nfidelity_sample = 1\nfidelity_tolerance = 0.1\n'
    (spec,) = specs(tmp_path, text)
    assert (spec.precision, spec.fidelity_sample, spec.fidelity_tolerance) == ("bfloat16", 1.0, 0.1)
    with pytest.raises(RegistryError, match="precision"):
        specs(tmp_path, lm + 'precision = "int8"\n')
    with pytest.raises(RegistryError, match="compile"):
        specs(tmp_path, lm + "compile = true\n")
