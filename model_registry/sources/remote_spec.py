"""A remote model's models.toml keys, read and checked (``RemoteSpec``): where its predictor
is, how it is called and what it is sent (``model_registry.sources.remote``)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model_registry.errors import RegistryError
from model_registry.sources.base import Source
from model_registry.sources.remote_payloads import SENDS, WORDS
from model_registry.spec import ModelSpec
from model_registry.table import Table, describe_value

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RemoteSpec:
    """Where and how to call a remote predictor (models.toml's remote keys)."""

    protocol: str
    url: str
    model_name: str
    #: header name -> value, ``"env:NAME"`` (the whole value) or ``${NAME}`` (within it)
    #: standing for an environment variable (read at load)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    max_batch: int = 64
    max_concurrency: int = 4
    retries: int = 2
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    #: remote:http: the request body, the batch placed at ``inputs_pointer``
    request_template: Mapping[str, Any] = field(default_factory=dict)
    inputs_pointer: str = "/instances"
    outputs_pointer: str = "/predictions"
    #: oip-v2: the output to read (None: the first)
    output_name: str | None = None
    #: what an instance is (``remote_payloads.SENDS``): the input tensors, the row's text,
    #: or the row encoded as a PNG or JPEG file in base64
    send: str = "tensors"
    #: text and images: an instance is ``{instance_key: value}`` ("" : the value itself)
    instance_key: str = ""
    #: text: what a word is (a regular expression) and what replaces an ablated word
    words: str = WORDS
    mask: str = ""
    #: images: the tensor value sent as 255
    pixel_max: float = 1.0

    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        if self.protocol == "kserve-v1":
            return f"{base}/v1/models/{self.model_name}:predict"
        if self.protocol == "oip-v2":
            return f"{base}/v2/models/{self.model_name}/infer"
        return self.url

    def describe(self) -> str:
        """The predictor as messages name it (no headers: they may hold credentials)."""
        return f"{self.protocol} predictor {self.model_name!r} at {self.endpoint()}"


# -- the model ------------------------------------------------------------------------------


def expand(value: str, spec: ModelSpec, name: str) -> str:
    """``value`` read from the environment: ``"env:NAME"`` is that variable's value, and
    each ``${NAME}`` within a value is replaced by it."""

    def read(var: str) -> str:
        found = os.environ.get(var)
        if found is None:
            raise RegistryError(
                f"header {name!r} names the environment variable {var}, which is not set",
                model=spec.id,
                field="headers",
            )
        return found

    if value.startswith("env:") and _NAME.fullmatch(value[4:]):
        return read(value[4:])
    return _ENV.sub(lambda m: read(m.group(1)), value)


#: where a ``request_template`` puts the batch of instances
PLACEHOLDER = "$instances"


def _template(table: Table) -> tuple[dict[str, Any], str | None]:
    """``request_template``: a table, or JSON text; and the JSON pointer of its
    ``"$instances"`` placeholder, if it has one."""
    template = table.get("request_template", {})
    if isinstance(template, str):
        try:
            template = json.loads(template)
        except ValueError as exc:
            table.fail("request_template", f"expected JSON text, got {template!r} ({exc})")
    if not isinstance(template, dict):
        table.fail(
            "request_template",
            f"expected a JSON object (text or a table), got {describe_value(template)}",
        )
    found = _placeholder(template, "")
    return template, found


def _placeholder(doc: Any, at: str) -> str | None:
    """The JSON pointer of the first ``"$instances"`` value in ``doc`` (None: none)."""
    if doc == PLACEHOLDER:
        return at
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    )
    for key, value in items:
        token = str(key).replace("~", "~0").replace("/", "~1")
        found = _placeholder(value, f"{at}/{token}")
        if found is not None:
            return found
    return None


def _number(table: Table, key: str, default: float, *, integer: bool, low: float) -> Any:
    v = table.get(key, default)
    kind_ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not kind_ok or v < low:
        what = "an integer" if integer else "a number"
        table.fail(key, f"expected {what} >= {low:g}, got {describe_value(v)}")
    return v


def remote_spec(table: Table, source: Source, spec: ModelSpec) -> RemoteSpec:
    url = table.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        table.fail(
            "url", f"expected the predictor's http:// or https:// URL, got {describe_value(url)}"
        )
    headers = table.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        table.fail("headers", "expected a table of header names to string values")
    template, placeholder = _template(table)
    if source.target != "http":
        for key in ("request_template", "inputs_pointer", "outputs_pointer", "scores_pointer"):
            if key in table:
                table.fail(key, f"only remote:http takes {key}")
    if "output_name" in table and source.target != "oip-v2":
        table.fail("output_name", "only remote:oip-v2 takes output_name")
    if "scores_pointer" in table and "outputs_pointer" in table:
        table.fail("outputs_pointer", "scores_pointer and outputs_pointer name the same; keep one")
    if placeholder is not None and "inputs_pointer" in table:
        table.fail("inputs_pointer", f'the request_template\'s "{PLACEHOLDER}" already places '
                                     "the instances; keep one")  # fmt: skip
    pointers = {}
    for key, name, default in (
        ("inputs_pointer", "inputs_pointer", placeholder or "/instances"),
        ("outputs_pointer", "scores_pointer" if "scores_pointer" in table else "outputs_pointer",
         "/predictions"),
    ):  # fmt: skip
        v = table.get(name, default)
        if not isinstance(v, str) or not (v == "" or v.startswith("/")):
            table.fail(name, f"expected a JSON pointer such as '/data', got {describe_value(v)}")
        pointers[key] = v
    name = table.get("model_name", spec.id)
    if not isinstance(name, str) or not name:
        table.fail("model_name", f"expected the predictor's model name, got {describe_value(name)}")
    out_name = table.get("output_name")
    if out_name is not None and not isinstance(out_name, str):
        table.fail("output_name", f"expected a string, got {describe_value(out_name)}")
    send = table.choice("send", SENDS, "tensors")
    texts_keys = {"words": str, "mask": str, "instance_key": str}
    for key, typ in texts_keys.items():
        if key in table and not isinstance(table.get(key), typ):
            table.fail(key, f"expected a string, got {describe_value(table.get(key))}")
    if send != "text":
        for key in ("words", "mask"):
            if key in table:
                table.fail(key, f'only a predictor sent text (send = "text") takes {key}')
    if "instance_key" in table and send == "tensors":
        table.fail("instance_key", "only text and images are sent as instances of one value")
    if "pixel_max" in table and send not in ("png", "jpeg"):
        table.fail("pixel_max", 'only images (send = "png" or "jpeg") take pixel_max')
    pattern = table.get("words", WORDS)
    try:
        re.compile(pattern)
    except re.error as exc:
        table.fail("words", f"expected a regular expression, got {pattern!r} ({exc})")
    if send in ("png", "jpeg"):
        shape = spec.inputs[0].shape if len(spec.inputs) == 1 else ()
        if len(spec.inputs) != 1 or len(shape) != 4 or shape[1] not in (1, 3):
            table.fail("inputs", "a predictor sent images takes one [N, C, H, W] input, C 1 or 3")
    return RemoteSpec(
        protocol=source.target,
        url=url,
        model_name=name,
        headers=dict(headers),
        timeout_s=float(_number(table, "timeout_s", 10.0, integer=False, low=0.001)),
        max_batch=int(_number(table, "max_batch", 64, integer=True, low=1)),
        max_concurrency=int(_number(table, "max_concurrency", 4, integer=True, low=1)),
        retries=int(_number(table, "retries", 2, integer=True, low=0)),
        breaker_failures=int(_number(table, "breaker_failures", 5, integer=True, low=1)),
        breaker_cooldown_s=float(_number(table, "breaker_cooldown_s", 30.0, integer=False, low=0)),
        request_template=dict(template),
        inputs_pointer=pointers["inputs_pointer"],
        outputs_pointer=pointers["outputs_pointer"],
        output_name=out_name,
        send=send,
        instance_key=table.get("instance_key", ""),
        words=pattern,
        mask=table.get("mask", ""),
        pixel_max=float(_number(table, "pixel_max", 1.0, integer=False, low=1e-9)),
    )
