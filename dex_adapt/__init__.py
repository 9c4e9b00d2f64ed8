"""dex_adapt: lossless Depth Exploration Decoding (DEX) and inducing adapters."""
