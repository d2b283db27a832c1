"""models.toml parsing: a good file, and every kind of mistake named by file, model and field."""

from __future__ import annotations

from pathlib import Path

import pytest

import model_registry
from model_registry import RegistryError
from model_registry.spec import InputSpec

GOOD = """
[[models]]
id = "churn"
version = 3
description = "churn model"
source = "python:somepkg.models:make"
weights = "w/churn.safetensors"
device = "cpu"
dtype = "float64"
labels = ["stays", "leaves"]
layers = ["fc1", "body.0"]
internal_batch_size = "auto"
perturbations_per_eval = 64
inputs = [
  { name = "x", dtype = "float64", shape = ["N", 12] },
  { name = "mask", dtype = "bool", shape = ["N", "L"] },
]

[[models]]
id = "tab"
source = "builtin:tabular-mlp"

[[models]]
id = "regressor"
source = "torchscript:reg.pt"
output_shape = []
[[models.inputs]]
name = "x"
dtype = "float32"
shape = ["N", 4]
"""


def write(tmp_path: Path, text: str, *files: str) -> Path:
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "w/churn.safetensors", "reg.pt")
    churn, tab, reg = model_registry.load_specs(str(path))
    assert churn.id == "churn" and churn.version == "3" and churn.description == "churn model"
    assert churn.device == "cpu" and churn.dtype == "float64"
    assert churn.inputs == (
        InputSpec("x", "float64", (None, 12)),
        InputSpec("mask", "bool", (None, None)),
    )
    assert churn.output.shape == (2,) and churn.output.labels == ("stays", "leaves")
    assert churn.layers == ("fc1", "body.0") and churn.embedding_layer is None
    assert churn.weights == "w/churn.safetensors" and churn.base_dir == str(tmp_path.resolve())
    assert churn.internal_batch_size == "auto" and churn.perturbations_per_eval == 64
    # a built-in source fills in everything not given from the built-in model
    builtin = {s.id: s for s in model_registry.builtin_specs()}["tabular-mlp"]
    assert tab.inputs == builtin.inputs and tab.output == builtin.output
    assert tab.layers == builtin.layers and tab.version == "1" and tab.device == "auto"
    assert reg.output.shape == () and reg.output.labels == () and reg.dtype == "float32"


def test_feature_names(tmp_path: Path) -> None:
    names = '["age", "income", "tenure", "plan"]'
    (m,) = model_registry.load_specs(
        write(tmp_path, PY.replace('name = "x"', f'name = "x", features = {names}'))
    )
    assert m.inputs[0].features == ("age", "income", "tenure", "plan")
    builtin = {s.id: s for s in model_registry.builtin_specs()}["tabular-mlp"]
    assert builtin.inputs[0].features is not None and len(builtin.inputs[0].features) == 8


def test_builtin_dtype_override_follows_into_float_inputs(tmp_path: Path) -> None:
    text = '[[models]]\nid = "t"\nsource = "builtin:text-classifier"\ndtype = "float64"\n'
    img = '[[models]]\nid = "i"\nsource = "builtin:image-cnn"\ndtype = "float64"\n'
    (t,) = model_registry.load_specs(write(tmp_path, text))
    (i,) = model_registry.load_specs(write(tmp_path, img))
    assert t.inputs[0].dtype == "int64" and t.embedding_layer == "embedding"
    assert i.inputs[0].dtype == "float64"


def test_none_means_the_builtin_registry() -> None:
    ids = [s.id for s in model_registry.load_specs(None)]
    assert ids == ["tabular-mlp", "tabular-noisy", "image-cnn", "text-classifier", "tiny-lm"]


MINIMAL = '[[models]]\nid = "m"\nsource = "builtin:tabular-mlp"\n'
PY = (
    '[[models]]\nid = "m"\nsource = "python:pkg.mod:make"\nlabels = ["a", "b"]\n'
    'inputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]\n'
)


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        (MINIMAL + "colour = 1\n", "colour", "unknown key"),
        (MINIMAL.replace('id = "m"\n', ""), "id", "required key is missing"),
        (MINIMAL.replace('"m"', '"has space"'), "id", "expected a string"),
        (MINIMAL.replace("builtin:tabular-mlp", "builtin:nope"), "source", "builtin:image-cnn"),
        (MINIMAL.replace("builtin:tabular-mlp", "onnx:m.onnx"), "source", "'torchscript:PATH'"),
        (MINIMAL.replace("builtin:tabular-mlp", "python:pkg"), "source", "package.module:fac"),
        (MINIMAL.replace("builtin:tabular-mlp", "export:missing.pt2"), "source", "not found"),
        (MINIMAL + 'device = "gpu"\n', "device", "'auto', 'cpu' or 'cuda:N'"),
        (MINIMAL + 'dtype = "float128"\n', "dtype", "expected one of ['float16'"),
        (MINIMAL + 'dtype = "int64"\n', "dtype", "expected one of"),
        (MINIMAL + "version = true\n", "version", "non-empty string"),
        (MINIMAL + "internal_batch_size = 0\n", "internal_batch_size", "positive integer"),
        (MINIMAL + 'perturbations_per_eval = "many"\n', "perturbations_per_eval", '"auto"'),
        (MINIMAL + 'weights = "nope.safetensors"\n', "weights", "not found"),
        (MINIMAL + 'layers = ["fc1", "fc1"]\n', "layers[1]", "duplicate"),
        (MINIMAL + 'layers = "fc1"\n', "layers", "array of strings"),
        (MINIMAL + 'layers = ["fc 1"]\n', "layers[0]", "dotted module paths"),
        (MINIMAL + 'labels = ["a", "a", "b"]\n', "labels[1]", "duplicate"),
        (MINIMAL + "embedding_layer = 3\n", "embedding_layer", "expected a string"),
        (PY.replace('labels = ["a", "b"]\n', ""), "output_shape", "required when there are no"),
        (PY + "output_shape = [3]\n", "output_shape", "with 2 labels the output must be [2]"),
        (PY + "output_shape = [0]\n", "output_shape", "dim 0 is an integer 0"),
        (PY.replace('inputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]\n', ""),
         "inputs", "non-empty array"),
        (PY.replace('"float32"', '"float"'), "inputs[0].dtype", "expected one of"),
        (PY.replace('["N", 4]', "[1, 4]"), "inputs[0].shape", "dim 0 is the batch and must"),
        (PY.replace('["N", 4]', '["N", -4]'), "inputs[0].shape", "dim 1 is an integer -4"),
        (PY.replace('["N", 4]', '["N", 4.0]'), "inputs[0].shape", "dim 1 is a float 4.0"),
        (PY.replace('["N", 4]', "[]"), "inputs[0].shape", "with dim 0 free"),
        (PY.replace('["N", 4]', '"N, 4"'), "inputs[0].shape", "got a string"),
        (PY.replace(', shape = ["N", 4]', ""), "inputs[0].shape", "missing key(s) ['shape']"),
        (PY.replace('name = "x"', 'name = "x", size = 4'), "inputs[0].size", "unknown key"),
        (PY.replace('name = "x"', 'name = "my x"'), "inputs[0].name", "identifier"),
        (PY.replace('name = "x"', 'name = "x", features = ["a", "b"]'), "inputs[0].features",
         "expected 4 distinct names, got 2"),
        (PY.replace('name = "x"', 'name = "x", features = ["a", "a", "b", "c"]'),
         "inputs[0].features", "distinct"),
        (PY.replace('name = "x"', 'name = "x", features = "abcd"'), "inputs[0].features",
         "array of names"),
        (PY.replace('["N", 4]', '["N", 2, 2]').replace('name = "x"', 'name = "x", features = []'),
         "inputs[0].features", "[N, F] input"),
    ],
)  # fmt: skip
def test_errors_name_file_model_and_field(
    tmp_path: Path, text: str, field: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        model_registry.load_specs(path)
    err = info.value
    assert err.file == str(path) and err.index == 0 and err.field == field
    assert expected in str(err)
    assert str(err).startswith(f"{path}, ")
    assert f"field {field!r}" in str(err)
    if err.model is not None:
        assert "model 'm' (models[0])" in str(err)


def test_error_names_the_model_id(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + MINIMAL.replace('"m"', '"second"') + 'device = "tpu"\n')
    with pytest.raises(RegistryError, match=r"model 'second' \(models\[1\]\), field 'device'"):
        model_registry.load_specs(path)


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + MINIMAL)
    with pytest.raises(RegistryError, match=r"models\[1\]\), field 'id': duplicate id; already"):
        model_registry.load_specs(path)


def test_torchscript_with_layers_is_refused_at_parse_time(tmp_path: Path) -> None:
    text = MINIMAL.replace("builtin:tabular-mlp", "torchscript:m.pt") + 'layers = ["fc1"]\n'
    text += 'labels = ["a"]\ninputs = [{ name = "x", dtype = "float32", shape = ["N", 2] }]\n'
    with pytest.raises(RegistryError, match="field 'layers': TorchScript models cannot run layer"):
        model_registry.load_specs(write(tmp_path, text, "m.pt"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[models]\n", "not valid TOML"),
        ("models = []\n", "non-empty [[models]] array"),
        ("title = 'x'\n" + MINIMAL, "unknown top-level key(s) ['title']"),
        ("models = [1]\n", "models[0]: expected a table"),
    ],
)
def test_file_level_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        model_registry.load_specs(path)
    assert str(info.value).startswith(str(path)) and expected in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="cannot read the models file"):
        model_registry.load_specs(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('source = "torchscript:../outside.pt"', "source"),
        ('source = "export:sub/../../outside.pt2"', "source"),
        ('source = "hf:../outside"', "source"),
        ('source = "python:pkg.mod:make"\nweights = "../outside.safetensors"', "weights"),
    ],
)
def test_relative_paths_stay_in_the_files_directory(tmp_path: Path, line: str, field: str) -> None:
    """A relative path may not climb out of the models.toml's directory (``../../etc/...``);
    a file elsewhere is named by an absolute path, which is taken."""
    here = tmp_path / "conf"
    here.mkdir()
    for name in ("outside.pt", "outside.pt2", "outside.safetensors"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "outside").mkdir()
    text = f'[[models]]\nid = "m"\n{line}\n' + PY[PY.index("labels") :]
    with pytest.raises(RegistryError) as info:
        model_registry.load_specs(write(here, text))
    assert info.value.field == field and "leaves the directory" in str(info.value)
    absolute = text.replace("../", str(tmp_path) + "/").replace("sub/", "")
    try:  # an absolute path passes the rule (the empty file may fail other checks)
        model_registry.load_specs(write(here, absolute))
    except RegistryError as exc:
        assert "leaves the directory" not in str(exc)
