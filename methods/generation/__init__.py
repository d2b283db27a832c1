"""Attribution of a causal language model's generated answer to its prompt.

See the README's "Generative language models".

res = methods.attribute_generation(model, tokenizer, "{} lives in", features=["alice"],
                                   target="paris")
res.seq_attr, res.token_attr, res.input_tokens, res.output_tokens
"""

from methods.generation.api import GenerationResult, attribute_generation
from methods.generation.errors import (
    EmptyPromptError,
    EmptyTargetError,
    TargetTooLongError,
    TemplateMismatchError,
    UnsupportedGenerationMethodError,
    UnsupportedLanguageModelError,
)

__all__ = [
    "EmptyPromptError",
    "EmptyTargetError",
    "GenerationResult",
    "TargetTooLongError",
    "TemplateMismatchError",
    "UnsupportedGenerationMethodError",
    "UnsupportedLanguageModelError",
    "attribute_generation",
]
