"""The source table: every registered source read from models.toml and loaded end to end, a new
source added by registering one class, and ``hf:`` directories served by the kind their
config.json's ``architectures`` give."""

from __future__ import annotations

import json
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import methods
import model_registry
from methods.export import save
from model_registry import RegistryError
from model_registry.models_toml import MODEL_KEYS
from model_registry.sources import SOURCES, ModelSource, Source, base, hf, parse_source
from model_registry.spec import ModelSpec
from model_registry.task_loaders import Built
from model_registry.tasks import TASKS
from tests.methods.test_generation import gpt2, gpt2_tokenizer

TENSOR = (
    'labels = ["a", "b", "c"]\ninputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]\n'
)


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).eval()


def builtin_example(tmp: Path) -> str:
    return 'source = "builtin:tabular-mlp"\n'


def torchscript_example(tmp: Path) -> str:
    with warnings.catch_warnings():  # torch deprecates TorchScript; serving old files is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(tiny()), str(tmp / "m.pt"))
    return 'source = "torchscript:m.pt"\n' + TENSOR


def export_example(tmp: Path) -> str:
    batch = {0: torch.export.Dim("batch")}
    program = torch.export.export(tiny(), (torch.zeros(3, 4),), dynamic_shapes=(batch,))
    torch.export.save(program, str(tmp / "m.pt2"))
    return 'source = "export:m.pt2"\n' + TENSOR


def attribution_export_example(tmp: Path) -> str:
    save(methods.export(tiny(), "saliency", torch.zeros(2, 4), target=0), tmp / "a.pt2")
    return 'source = "attribution-export:a.pt2"\n'  # inputs and output from its description


def python_example(tmp: Path) -> str:
    name = f"tiny_{uuid.uuid4().hex}"
    (tmp / f"{name}.py").write_text(
        "from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Linear(4, 3))\n"
    )
    return f'source = "python:{name}:make"\n' + TENSOR


def hf_example(tmp: Path) -> str:
    gpt2().save_pretrained(tmp / "lm")
    gpt2_tokenizer().save_pretrained(tmp / "lm")
    return 'source = "hf:lm"\n'


#: one models.toml table per source (a source without one fails test_every_source_has_one)
def remote_example(tmp: Path) -> str:
    return (
        'source = "remote:kserve-v1"\nurl = "http://127.0.0.1:9"\nlabels = ["a", "b"]\n'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 3] }]\n'
    )


EXAMPLES: dict[str, tuple[Callable[[Path], str], str]] = {
    "builtin": (builtin_example, "tensor"),
    "torchscript": (torchscript_example, "tensor"),
    "export": (export_example, "tensor"),
    "attribution-export": (attribution_export_example, "tensor"),
    "python": (python_example, "tensor"),
    "hf": (hf_example, "causal_lm"),
    "remote": (remote_example, "tensor"),
}


@pytest.fixture
def clean_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("tiny_"):
            del sys.modules[name]


def read(tmp: Path, table: str) -> ModelSpec:
    (tmp / "models.toml").write_text(f'[[models]]\nid = "m"\n{table}')
    (spec,) = model_registry.load_specs(tmp / "models.toml")
    return spec


def test_every_source_has_one_example() -> None:
    assert set(EXAMPLES) == set(SOURCES)


@pytest.mark.parametrize("name", list(SOURCES))
def test_each_source_is_found_read_and_loaded(
    name: str, tmp_path: Path, clean_modules: None
) -> None:
    found = SOURCES[name]
    assert found.name == name and type(found).__module__ == (
        f"model_registry.sources.{name.replace('-', '_')}"
    )  # one module per source, named for it
    assert set(found.tasks) <= set(TASKS) and found.tasks
    assert not set(found.own_keys) & set(MODEL_KEYS)
    assert set(found.refused) <= {*MODEL_KEYS, *found.own_keys}
    example, kind = EXAMPLES[name]
    spec = read(tmp_path, example(tmp_path))
    assert parse_source(spec.source) == Source(name, spec.source.partition(":")[2])
    assert spec.task == kind
    loaded = model_registry.load(spec)
    assert loaded.extra["source_kind"] == name and loaded.device == torch.device("cpu")
    assert not any(p.requires_grad for p in loaded.model.parameters())


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_malformed_source_lists_every_source(name: str) -> None:
    with pytest.raises(ValueError, match=r"got 'onnx:m\.onnx'") as info:
        parse_source("onnx:m.onnx")
    assert repr(SOURCES[name].syntax) in str(info.value)


class ConstSource(ModelSource):
    """A source added by registering one class: ``const:N``, a linear map of N features."""

    name = "const"
    syntax = "const:FEATURES"

    def check_target(self, target: str) -> None:
        if not target.isdigit():
            raise ValueError(f"expected const:FEATURES (a number), got {target!r}")

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        torch.manual_seed(0)
        return Built(nn.Linear(int(source.target), 3))


@pytest.fixture
def const_source() -> Iterator[None]:
    base.register(ConstSource)
    try:
        yield
    finally:
        del base._SOURCES["const"]  # the table as it was, for the tests parametrized over it


def test_a_registered_source_is_read_and_loaded(tmp_path: Path, const_source: None) -> None:
    spec = read(tmp_path, 'source = "const:4"\nlayers = []\n' + TENSOR)
    loaded = model_registry.load(spec)
    assert loaded.extra["source_kind"] == "const"
    assert loaded.model(torch.zeros(2, 4)).shape == (2, 3)
    with pytest.raises(RegistryError, match=r"field 'source': expected const:FEATURES"):
        read(tmp_path, 'source = "const:four"\n' + TENSOR)
    with pytest.raises(RegistryError, match="a causal_lm model cannot come from a const: source"):
        read(tmp_path, 'source = "const:4"\nkind = "causal_lm"\n')
    with pytest.raises(ValueError, match="registered twice"):
        base.register(ConstSource)


# -- hf: the kind from config.json ------------------------------------------------------------


def hf_dir(tmp: Path, config: dict[str, object] | None) -> str:
    (tmp / "d").mkdir()
    if config is not None:
        (tmp / "d" / "config.json").write_text(json.dumps(config))
    return 'source = "hf:d"\n'


@pytest.mark.parametrize(
    "architecture", ["GPT2LMHeadModel", "LlamaForCausalLM", "XLMWithLMHeadModel"]
)
def test_hf_kind_comes_from_the_config(tmp_path: Path, architecture: str) -> None:
    table = hf_dir(tmp_path, {"architectures": [architecture], "model_type": "x"})
    assert read(tmp_path, table).task == "causal_lm"
    assert read(tmp_path, table + 'kind = "causal_lm"\n').task == "causal_lm"  # may repeat it


def test_hf_explicit_kind_is_enough_without_architectures(tmp_path: Path) -> None:
    table = hf_dir(tmp_path, {"model_type": "gpt2"})
    assert read(tmp_path, table + 'kind = "causal_lm"\n').task == "causal_lm"
    with pytest.raises(RegistryError, match="names no architectures") as info:
        read(tmp_path, table)
    assert info.value.field == "source"


@pytest.mark.parametrize(
    "architectures",
    [["ViTModel"], ["GPT2Model"]],
)
def test_hf_unserved_architecture_is_refused(tmp_path: Path, architectures: list[str]) -> None:
    table = hf_dir(tmp_path, {"architectures": architectures})
    with pytest.raises(RegistryError) as info:
        read(tmp_path, table)
    err = info.value
    assert err.model == "m" and err.field == "source"
    assert str(architectures) in str(err)  # what it found
    assert "*ForCausalLM, *LMHeadModel (kind 'causal_lm')" in str(err)  # what is served
    for end, kind in (
        ("Sequence", "text_classification"),
        ("Token", "token_classification"),
        ("Image", "image_classification"),
    ):
        assert f"*For{end}Classification (kind {kind!r})" in str(err)
    with pytest.raises(RegistryError, match=r"contradicts the directory's config\.json") as info:
        read(tmp_path, table + 'kind = "causal_lm"\n')
    assert info.value.field == "kind"


def test_hf_kind_contradicting_the_config_names_the_field(tmp_path: Path) -> None:
    table = hf_dir(tmp_path, {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(RegistryError, match=r"'tensor' contradicts .* served as \['causal_lm'\]"):
        read(tmp_path, table + 'kind = "tensor"\n')


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, "has no config.json"),
        ({"architectures": "GPT2LMHeadModel"}, "expected 'architectures' to list class names"),
    ],
)
def test_hf_config_problems_name_the_source(
    tmp_path: Path, config: dict[str, object] | None, expected: str
) -> None:
    table = hf_dir(tmp_path, config)
    with pytest.raises(RegistryError, match=expected) as info:
        read(tmp_path, table)
    assert info.value.field == "source"


def test_hf_weights_are_refused(tmp_path: Path) -> None:
    table = hf_dir(tmp_path, {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(RegistryError, match="field 'weights': hf: directories carry their own"):
        read(tmp_path, table + 'weights = "w.safetensors"\n')


def test_hf_tables_agree() -> None:
    """Every kind an architecture maps to is a model kind with a transformers class to load
    it, and ``kinds`` are exactly those."""
    mapped = {*hf.ARCHITECTURES.values(), *hf.PROBLEM_TYPES.values()}
    assert mapped == set(hf.AUTO_CLASSES) == set(SOURCES["hf"].tasks)
    assert set(hf.AUTO_CLASSES) <= set(TASKS)
    assert hf.architecture_task("GPT2LMHeadModel") == "causal_lm"
    assert hf.architecture_task("BertModel") is None
    problem = "multi_label_classification"
    assert hf.architecture_task("BertForSequenceClassification", problem) == problem
    assert hf.architecture_task("BertForSequenceClassification", "regression") == "regression"
    assert hf.architecture_task("BertForTokenClassification", problem) == "token_classification"


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ('source = "remote:grpc"\nurl = "http://h"', "source", "kserve-v1"),
        ('source = "remote:kserve-v1"\nurl = "h:1"', "url", "http:// or https://"),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nlayers = ["a"]', "layers", "remote"),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nmax_batch = 0', "max_batch", ">= 1"),
        (
            'source = "remote:oip-v2"\nurl = "http://h"\ninputs_pointer = "/x"',
            "inputs_pointer",
            "only remote:http",
        ),
        (
            'source = "remote:http"\nurl = "http://h"\noutputs_pointer = "x"',
            "outputs_pointer",
            "JSON pointer",
        ),
        (
            'source = "remote:kserve-v1"\nurl = "http://h"\nheaders = { A = 1 }',
            "headers",
            "string values",
        ),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nsend = "pdf"', "send", "tensors"),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nsend = "text"', "kind", "text_class"),
        (
            'source = "remote:kserve-v1"\nurl = "http://h"\nkind = "text_classification"',
            "send",
            'send = "text"',
        ),
        (
            'source = "remote:kserve-v1"\nurl = "http://h"\nkind = "text_classification"\n'
            'send = "text"',
            "inputs",
            "remove this",
        ),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nwords = "x"', "words", "sent text"),
        ('source = "remote:kserve-v1"\nurl = "http://h"\npixel_max = 2', "pixel_max", "images"),
        ('source = "remote:kserve-v1"\nurl = "http://h"\nsend = "png"', "inputs", "C, H, W"),
        (
            'source = "remote:kserve-v1"\nurl = "http://h"\ninstance_key = "b64"',
            "instance_key",
            "one value",
        ),
    ],
)
def test_a_remote_table_s_mistakes_name_their_field(
    tmp_path: Path, table: str, field: str, message: str
) -> None:
    inputs = '\nlabels = ["a", "b"]\ninputs = [{ name = "x", dtype = "float32", shape = ["N", 3] }]'
    with pytest.raises(RegistryError, match=message) as info:
        read(tmp_path, table + inputs)
    assert info.value.field == field or field in str(info.value)


def test_a_remote_header_names_an_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = (
        'source = "remote:kserve-v1"\nurl = "http://h"\nlabels = ["a", "b"]\n'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 3] }]\n'
        'headers = { Authorization = "Bearer ${NOT_SET_ANYWHERE}" }'
    )
    spec = read(tmp_path, table)
    assert spec.remote.headers == {"Authorization": "Bearer ${NOT_SET_ANYWHERE}"}
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(RegistryError, match="NOT_SET_ANYWHERE, which is not set"):
        model_registry.load(spec)
    monkeypatch.setenv("NOT_SET_ANYWHERE", "xyz")
    loaded = model_registry.load(spec)
    assert "xyz" not in repr(loaded.model) and "Bearer" not in repr(loaded.model)


def test_a_remote_header_may_be_env_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CONTRACT 8.2: a header value "env:NAME" is that environment variable, read at load."""
    table = (
        'source = "remote:kserve-v1"\nurl = "http://h"\nlabels = ["a", "b"]\n'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 3] }]\n'
        'headers = { Authorization = "env:NOT_SET_ANYWHERE" }'
    )
    spec = read(tmp_path, table)
    assert spec.remote.timeout_s == 10.0  # the contract's default
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(RegistryError, match="NOT_SET_ANYWHERE, which is not set"):
        model_registry.load(spec)
    from model_registry.sources.remote_spec import expand

    monkeypatch.setenv("NOT_SET_ANYWHERE", "Bearer xyz")
    assert expand("env:NOT_SET_ANYWHERE", spec, "Authorization") == "Bearer xyz"
    assert expand("a ${NOT_SET_ANYWHERE}", spec, "Authorization") == "a Bearer xyz"


def test_a_remote_http_template_is_json_text_with_its_placeholder(tmp_path: Path) -> None:
    """CONTRACT 8.2: request_template is JSON text whose "$instances" marks where the batch
    goes; scores_pointer says where the scores are."""
    head = (
        'source = "remote:http"\nurl = "http://h/score"\nlabels = ["a", "b"]\n'
        'inputs = [{ name = "x", dtype = "float32", shape = ["N", 3] }]\n'
    )
    spec = read(tmp_path, head + 'request_template = \'{"data": {"rows": "$instances"}, "v": 1}\'\n'
                'scores_pointer = "/out/scores"')  # fmt: skip
    r = spec.remote
    assert r.inputs_pointer == "/data/rows" and r.outputs_pointer == "/out/scores"
    assert r.request_template == {"data": {"rows": "$instances"}, "v": 1}
    for extra, field in (
        ('request_template = "not json"', "request_template"),
        ('request_template = \'{"rows": "$instances"}\'\ninputs_pointer = "/x"', "inputs_pointer"),
        ('scores_pointer = "/a"\noutputs_pointer = "/b"', "outputs_pointer"),
        ('scores_pointer = "a"', "scores_pointer"),
    ):
        with pytest.raises(RegistryError) as info:
            read(tmp_path, head + extra)
        assert info.value.field == field, str(info.value)


def test_a_remote_text_model_reads_its_words(tmp_path: Path) -> None:
    head = (
        'source = "remote:oip-v2"\nurl = "http://h"\nkind = "text_classification"\n'
        'send = "text"\nlabels = ["a", "b"]\n'
    )
    with pytest.raises(RegistryError, match="regular expression") as info:
        read(tmp_path, head + 'words = "(unclosed"')
    assert info.value.field == "words"
    spec = read(tmp_path, head + "words = '\\w+'\nmask = \"[MASK]\"")
    assert spec.takes_text and spec.texts_batch and spec.inputs[0].dtype == "int64"
    loaded = model_registry.load(spec)
    ids, words = loaded.tokenizer(["Hi, you!"])
    assert words == [["Hi", "you"]]
    assert loaded.model.words.texts(loaded.tokenizer.baseline(ids)) == ["[MASK], [MASK]!"]


def test_words_rebuild_each_text_and_mask_one_word_at_a_time() -> None:
    from model_registry.sources.remote_payloads import PADDED, Words

    words = Words()
    texts = ["  Hello,  world!\n", "one", "Hello,  again"]
    ids, tokens = words(texts)
    assert tokens == [["Hello,", "world!"], ["one"], ["Hello,", "again"]]
    assert words.texts(ids) == [*texts[:2], "Hello,  again"]
    assert int(ids[1, 1]) == PADDED
    masked = ids.clone()
    masked[0, 0] = words.baseline(ids)[0, 0]
    assert words.texts(masked)[0] == "    world!\n"  # the word dropped, the space around kept
    with pytest.raises(ValueError, match="no words"):
        words(["   "])
    with pytest.raises(Exception, match="names no word"):
        words.texts(torch.tensor([[10_000]]))
    small = Words(limit=4)
    small(["a b c"])
    again, _ = small(["d e"])  # past the limit: the table starts over, the new ids still hold
    assert small.texts(again) == ["d e"]
