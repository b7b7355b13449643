"""TFHE attention circuits studied per sequence length (imports models, quant and fhe)."""
