"""dex_adapt: lossless Depth Exploration Decoding (DEX) and inducing adapters."""

# Registers the inducing-adapter method with PEFT (deferred until PEFT itself is imported: cheap).
from dex_adapt import adapters as adapters  # noqa: E402,F401
