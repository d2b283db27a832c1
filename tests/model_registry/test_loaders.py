"""Each loader on a tiny model made in a temporary directory, device resolution, layer checks."""

from __future__ import annotations

import sys
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import methods
import model_registry
from model_registry import RegistryError
from model_registry.checks import resolve_device
from model_registry.spec import InputSpec, ModelSpec, OutputSpec

FACTORY = """
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))

def make():
    return Tiny()

def make_with_tokenizer():
    return Tiny(), str.split

def broken():
    raise ValueError("no GPU today")

def not_a_module():
    return 42
"""


class Tiny(nn.Module):  # the same architecture as FACTORY's, for saving files from the test
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return Tiny().eval()


X = torch.linspace(-1, 1, 12).reshape(3, 4)


@pytest.fixture
def factory_module(tmp_path: Path) -> Iterator[str]:
    """A uniquely named factory module next to the (future) models.toml in ``tmp_path``."""
    name = f"tiny_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY))
    yield name
    sys.modules.pop(name, None)


def toml(tmp_path: Path, source: str, extra: str = "") -> Path:
    path = tmp_path / "models.toml"
    path.write_text(
        f'[[models]]\nid = "tiny"\nsource = "{source}"\nlabels = ["a", "b", "c"]\n{extra}'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]\n'
    )
    return path


def load_one(path: Path) -> model_registry.LoadedModel:
    (spec,) = model_registry.load_specs(path)
    return model_registry.load(spec)


def check_tiny(loaded: model_registry.LoadedModel, reference: nn.Module | None = None) -> None:
    assert loaded.device == torch.device("cpu")
    assert not any(p.requires_grad for p in loaded.model.parameters())
    out = loaded.model(X)
    assert out.shape == (3, 3)
    if reference is not None:
        torch.testing.assert_close(out, reference(X))
    # the engine runs on what the registry loaded
    res = methods.attribute(loaded.model, X, "integrated_gradients", target=1)
    assert isinstance(res.attributions, torch.Tensor) and res.attributions.shape == X.shape


def test_python_factory_with_safetensors_weights(tmp_path: Path, factory_module: str) -> None:
    ref = tiny()
    (tmp_path / "w").mkdir()
    save_file(ref.state_dict(), str(tmp_path / "w" / "tiny.safetensors"))
    path = toml(
        tmp_path,
        f"python:{factory_module}:make",
        'weights = "w/tiny.safetensors"\nlayers = ["body.0", "head"]\n',
    )
    loaded = load_one(path)
    assert not loaded.model.training and loaded.tokenizer is None and not loaded.is_torchscript
    check_tiny(loaded, ref)
    assert factory_module in sys.modules and str(tmp_path) not in sys.path  # path restored


def test_python_factory_with_torch_save_state_dict(tmp_path: Path, factory_module: str) -> None:
    ref = tiny()
    torch.save(ref.state_dict(), tmp_path / "tiny.pt")
    loaded = load_one(toml(tmp_path, f"python:{factory_module}:make", 'weights = "tiny.pt"\n'))
    check_tiny(loaded, ref)


def test_python_factory_may_return_a_tokenizer(tmp_path: Path, factory_module: str) -> None:
    loaded = load_one(toml(tmp_path, f"python:{factory_module}:make_with_tokenizer"))
    assert loaded.tokenizer is str.split


def test_python_weights_that_do_not_fit(tmp_path: Path, factory_module: str) -> None:
    save_file({"head.weight": torch.zeros(2, 2)}, str(tmp_path / "bad.safetensors"))
    path = toml(tmp_path, f"python:{factory_module}:make", 'weights = "bad.safetensors"\n')
    with pytest.raises(RegistryError, match=r"field 'weights': weights .* do not fit.*Missing"):
        load_one(path)


def test_pickled_weights_are_refused(tmp_path: Path, factory_module: str) -> None:
    torch.save(tiny(), tmp_path / "whole.pt")  # a pickled module, not a state_dict
    path = toml(tmp_path, f"python:{factory_module}:make", 'weights = "whole.pt"\n')
    with pytest.raises(RegistryError, match=r"field 'weights': cannot read weights"):
        load_one(path)


@pytest.mark.parametrize(
    ("attr", "expected"),
    [
        ("broken", "factory '.*:broken' raised ValueError: no GPU today"),
        ("not_a_module", "returned int; expected an nn.Module"),
        ("absent", "has no attribute 'absent'"),
    ],
)
def test_python_factory_errors(
    tmp_path: Path, factory_module: str, attr: str, expected: str
) -> None:
    with pytest.raises(RegistryError, match=f"model 'tiny', field 'source': .*{expected}"):
        load_one(toml(tmp_path, f"python:{factory_module}:{attr}"))


def test_python_missing_module(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"cannot import module 'no_such_mod_xyz' \(also"):
        load_one(toml(tmp_path, "python:no_such_mod_xyz:make"))


def test_torchscript(tmp_path: Path) -> None:
    ref = tiny()
    with warnings.catch_warnings():  # torch deprecates TorchScript; serving old files is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(ref), str(tmp_path / "tiny.pt"))
    loaded = load_one(toml(tmp_path, "torchscript:tiny.pt"))
    assert loaded.is_torchscript
    check_tiny(loaded, ref)
    # a programmatic spec with layers is refused at load time too
    with pytest.raises(RegistryError, match="field 'layers': TorchScript models cannot run layer"):
        model_registry.load(replace(loaded.spec, layers=("head",)))


def test_torchscript_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(RegistryError, match="is not a loadable TorchScript file"):
        load_one(toml(tmp_path, "torchscript:junk.pt"))


def export(tmp_path: Path, model: nn.Module, dynamic: bool = True) -> None:
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    program = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=shapes)
    torch.export.save(program, str(tmp_path / "tiny.pt2"))


def test_export(tmp_path: Path) -> None:
    ref = tiny()
    export(tmp_path, ref)
    check_tiny(load_one(toml(tmp_path, "export:tiny.pt2")), ref)


def test_export_with_layers_keeps_hookable_submodules(tmp_path: Path) -> None:
    ref = tiny()
    export(tmp_path, ref)
    loaded = load_one(toml(tmp_path, "export:tiny.pt2", 'layers = ["body.0"]\n'))
    check_tiny(loaded, ref)
    seen: list[torch.Size] = []
    handle = loaded.model.get_submodule("body.0").register_forward_hook(
        lambda _m, _i, out: seen.append(out.shape)
    )
    try:
        loaded.model(X)
    finally:
        handle.remove()
    assert seen == [torch.Size([3, 8])]


def test_export_without_dynamic_batch_is_explained(tmp_path: Path) -> None:
    export(tmp_path, tiny(), dynamic=False)
    with pytest.raises(RegistryError, match=r"field 'inputs'.*dynamic batch dim"):
        load_one(toml(tmp_path, "export:tiny.pt2"))


def spec(**kw: object) -> ModelSpec:
    base = ModelSpec(
        id="t",
        version="1",
        description="",
        source="builtin:tabular-mlp",
        device="cpu",
        dtype="float32",
        inputs=(InputSpec("x", "float32", (None, 8)),),
        output=OutputSpec((3,), ("low", "mid", "high")),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_device_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert model_registry.load(spec(device="auto")).device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda:0")


def test_missing_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RegistryError, match="field 'device': cuda:1 requested but this machine"):
        model_registry.load(spec(device="cuda:1"))
    with pytest.raises(RegistryError, match="field 'device': expected 'auto', 'cpu' or 'cuda:N'"):
        model_registry.load(spec(device="gpu"))


def test_dtype_cast() -> None:
    loaded = model_registry.load(
        spec(dtype="float64", inputs=(InputSpec("x", "float64", (None, 8)),))
    )
    assert all(p.dtype == torch.float64 for p in loaded.model.parameters())


def test_unknown_layer_lists_the_nearest_names() -> None:
    with pytest.raises(RegistryError) as info:
        model_registry.load(spec(layers=("fc1", "fc_2")))
    assert info.value.field == "layers" and info.value.model == "t"
    assert "no submodule 'fc_2'; nearest: ['fc2'" in str(info.value)
    with pytest.raises(RegistryError, match=r"field 'embedding_layer': .*no submodule 'embed'"):
        model_registry.load(spec(embedding_layer="embed"))


def test_wrong_declarations_are_caught_by_a_forward_pass() -> None:
    with pytest.raises(RegistryError, match="field 'inputs': a forward pass on zeros"):
        model_registry.load(spec(inputs=(InputSpec("x", "float32", (None, 5)),)))
    with pytest.raises(RegistryError, match=r"field 'output_shape': .* returned shape \[2, 3\]"):
        model_registry.load(spec(output=OutputSpec((4,))))
