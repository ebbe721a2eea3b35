"""An OpenAI-compatible caching gateway for SGLang and vLLM serving lanes."""

__version__ = "0.1.0"
