"""FHE backends (TFHE via concrete-python, CKKS via TenSEAL), the shared harness and the CLI."""
